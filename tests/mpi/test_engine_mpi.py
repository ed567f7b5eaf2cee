"""The MPI-parallel search (real MPICH from the venv): 2 ranks give the serial answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.mpi

SCRIPT = r"""
import json, sys
from pathlib import Path
from memx_hpc.spec import load_site, load_job
from memx_hpc.model.api import AnalyticCostModel
from memx_hpc.search.cache import PredictionCache
from memx_hpc.search.engine import SearchOptions, mpi_comm, search
from memx_hpc.search.objective import Weights
from memx_hpc.search.space import PlanSpace, SpaceOptions
root = Path(sys.argv[1])
site = load_site(root / "site_configs" / "example-cross-vendor.yaml")
job = load_job(root / "jobs" / "gpt3-2.7b.yaml")
model = AnalyticCostModel(site, compute_efficiency=0.5)
space = PlanSpace(site, job, SpaceOptions(max_pipeline_stages=3))
comm = mpi_comm()
cache = PredictionCache(identity=model.identity, path=Path(sys.argv[2])) if len(sys.argv) > 2 else None
r = search(space, model, options=SearchOptions(top_k=8, weights=Weights(time=1, memory=1, balance=0.5),
                                               block_size=5000, time_noise=0.03,
                                               memory_error={"A100-80": 0.18, "MI250X-GCD": 0.26, "V100-32": 0.3}),
           cache=cache, comm=comm)
if comm is None or comm.Get_rank() == 0:
    print(json.dumps({"ranks": r.stats.ranks, "top": [[s.index, s.score, s.time_rank] for s in r.top],
                      "time_top": [[s.index, s.prediction.iteration_ms] for s in r.time_top],
                      "recommended_top": [[s.index, s.risk_utilisation, s.time_rank] for s in r.recommended_top],
                      "risk_feasible": r.risk_feasible,
                      "margin_aside": [r.margin_aside.index if r.margin_aside else None, r.margin_aside_count],
                      "pareto": [[p.index, p.iteration_ms, p.max_utilisation] for p in r.pareto],
                      "plans": r.stats.plans, "feasible": r.stats.feasible, "cache": r.stats.cache}))
"""


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    for v in ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS"):
        env.pop(v, None)
    return env


def _run(mpiexec: str | None, n: int, *extra: str) -> dict:
    """The script serially (``mpiexec`` None) or on ``n`` ranks."""
    cmd = [sys.executable, "-c", SCRIPT, str(ROOT), *extra]
    if mpiexec is not None:
        cmd = [mpiexec, "-n", str(n)] + cmd
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_two_ranks_give_the_serial_answer(tmp_path, mpiexec):
    serial = _run(None, 1)
    parallel = _run(mpiexec, 2, str(tmp_path / "cache.sqlite"))
    assert serial["ranks"] == 1 and parallel["ranks"] == 2
    for key in ("top", "time_top", "recommended_top", "risk_feasible", "margin_aside", "pareto", "plans", "feasible"):
        assert parallel[key] == serial[key], key
    # the recommended and the fastest feasible plan come out identical (and exist)
    assert serial["recommended_top"] and serial["time_top"]
    # the ranks predicted disjoint shares of the misses; the file now holds all of them
    assert parallel["cache"]["predicted"] == parallel["cache"]["unique"] > 0
    again = _run(mpiexec, 2, str(tmp_path / "cache.sqlite"))
    assert again["cache"]["predicted"] == 0 and again["cache"]["file_hits"] == again["cache"]["unique"]
    assert again["top"] == serial["top"]


def test_cli_search_under_mpiexec(tmp_path, mpiexec):
    args = ["-m", "memx_hpc", "search", "--site", str(ROOT / "site_configs" / "example-cross-vendor.yaml"),
            "--job", str(ROOT / "jobs" / "llama2-7b.yaml"), "--store", str(tmp_path / "store.h5"),
            "--out", str(tmp_path / "out"), "--max-stages", "2", "--top", "3", "--json"]
    # every rank searches, however small the space (the default leaves it to rank 0: below)
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, *args, "--mpi", "--min-plans-per-rank", "0"],
                          capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    par = json.loads(proc.stdout)
    ser = json.loads(subprocess.run([sys.executable, *args], capture_output=True, text=True, env=_env(),
                                    timeout=300, check=True).stdout)
    assert par["stats"]["ranks"] == 2 and ser["stats"]["ranks"] == 1
    assert [t["index"] for t in par["top"]] == [t["index"] for t in ser["top"]]
    assert (tmp_path / "out" / "latest" / "plan-01.json").is_file()
    # the three picks come out identical for 1 and 2 ranks
    for role in ("recommended", "fastest", "weighted"):
        assert par[role]["index"] == ser[role]["index"], role


def test_a_space_too_small_for_its_ranks_is_searched_on_rank_0_alone(tmp_path, mpiexec):
    """Two ranks on a space far below MIN_PLANS_PER_RANK per rank: rank 0 searches alone and
    says why, the other rank prints nothing and exits 0, the picks are the serial ones."""
    from memx_hpc.planner import MIN_PLANS_PER_RANK
    args = ["-m", "memx_hpc", "plan", "--site", str(ROOT / "site_configs" / "example-cross-vendor.yaml"),
            "--job", str(ROOT / "jobs" / "gpt3-2.7b.yaml"), "--store", str(tmp_path / "store.h5"),
            "--no-profile", "--max-stages", "2", "--top", "3", "--json"]
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, *args, "--out", str(tmp_path / "par"), "--mpi"],
                          capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    par = json.loads(proc.stdout)  # one JSON document: the idle rank printed nothing
    ser = json.loads(subprocess.run([sys.executable, *args, "--out", str(tmp_path / "ser")], capture_output=True,
                                    text=True, env=_env(), timeout=300, check=True).stdout)
    assert par["stats"]["ranks"] == 1 and par["stats"]["plans"] < 2 * MIN_PLANS_PER_RANK
    assert [n for n in par["notes"] if n.startswith("MPI: 2 ranks were started")]
    for role in ("recommended", "fastest", "weighted"):
        assert par[role]["index"] == ser[role]["index"], role


def test_an_error_on_rank_0_alone_stops_the_idle_ranks_with_it(tmp_path, mpiexec):
    """Rank 0 searches alone and cannot write its plans: the idle rank exits 2 with the same message."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    args = ["-m", "memx_hpc", "plan", "--site", str(ROOT / "site_configs" / "example-cross-vendor.yaml"),
            "--job", str(ROOT / "jobs" / "gpt3-2.7b.yaml"), "--store", str(tmp_path / "store.h5"), "--no-profile",
            "--max-stages", "1", "--out", str(blocker / "out"), "--mpi"]
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, *args], capture_output=True, text=True, env=_env(),
                          timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.count(str(blocker)) >= 2 and "Traceback" not in proc.stderr


def test_mpi_flag_without_launcher_is_a_system_error(tmp_path):
    args = ["-m", "memx_hpc", "search", "--site", str(ROOT / "site_configs" / "example-cross-vendor.yaml"),
            "--job", str(ROOT / "jobs" / "gpt3-2.7b.yaml"), "--store", str(tmp_path / "s.h5"), "--mpi"]
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 2 and "mpiexec" in proc.stderr and "Traceback" not in proc.stderr


def _two_ranks_stop_on_a_fault(mpiexec: str, command: str, store: Path, out: Path) -> None:
    """``command`` on the local site under ``mpiexec -n 2`` exits 2 on every rank, each
    naming ``store``, without a traceback, and writes no plans."""
    args = ["-m", "memx_hpc", command, "--site", str(ROOT / "site_configs" / "local.yaml"),
            "--job", str(ROOT / "jobs" / "tiny-gpt.yaml"), "--store", str(store), "--out", str(out),
            "--max-stages", "2", "--mpi"]
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, *args], capture_output=True, text=True, env=_env(),
                          timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.count(str(store)) >= 2 and "Traceback" not in proc.stderr  # both ranks said why
    assert not out.exists()


def test_plan_under_mpiexec_stops_every_rank_when_profiling_cannot_run(tmp_path, mpiexec):
    """Rank 0 profiles; when the store is locked every rank exits 2 (none waits for rank 0 forever)."""
    import socket
    store = tmp_path / "store.h5"
    Path(str(store) + ".lock").write_text(f"{os.getpid()}@{socket.gethostname()}\n")  # this live process holds it
    _two_ranks_stop_on_a_fault(mpiexec, "plan", store, tmp_path / "out")


def test_search_under_mpiexec_stops_every_rank_when_the_store_is_unreadable(tmp_path, mpiexec):
    """Rank 0 loads the cost model first; when the store is not HDF5 every rank exits 2
    naming it (none waits at the barrier for a rank 0 that has stopped)."""
    store = tmp_path / "store.h5"
    store.write_text("not an HDF5 file\n")
    _two_ranks_stop_on_a_fault(mpiexec, "search", store, tmp_path / "out")
    assert store.read_text() == "not an HDF5 file\n"


def test_search_under_mpiexec_stops_every_rank_when_the_cache_is_damaged(tmp_path, mpiexec):
    """Only rank 0 opens the prediction cache; when it is not SQLite (or is locked past its
    busy timeout) rank 0 failed and rank 1 waited for it forever. Every rank now exits 2 naming it."""
    cache = tmp_path / "store.cache.sqlite"
    cache.write_bytes(b"\x01" * 8192)
    args = ["-m", "memx_hpc", "search", "--site", str(ROOT / "site_configs" / "local.yaml"), "--analytic",
            "--job", str(ROOT / "jobs" / "tiny-gpt.yaml"), "--store", str(tmp_path / "store.h5"),
            "--out", str(tmp_path / "out"), "--max-stages", "2", "--mpi"]
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, *args], capture_output=True, text=True, env=_env(),
                          timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.count(str(cache)) >= 2 and "Traceback" not in proc.stderr  # both ranks said why
    assert cache.read_bytes() == b"\x01" * 8192


def test_search_under_mpiexec_stops_every_rank_when_the_cache_is_locked(tmp_path, mpiexec):
    """Another process holds the prediction cache's SQLite lock for the whole run: rank 0
    waits out the cache's busy timeout (PredictionCache.timeout_s) and fails; rank 1 used to
    wait for it forever. Both ranks now exit 2 naming the cache, in bounded time, and the
    holder's transaction is untouched."""
    import sqlite3
    import time

    from memx_hpc.search.cache import PredictionCache

    cache = tmp_path / "store.cache.sqlite"
    holder = sqlite3.connect(str(cache), isolation_level=None)
    holder.execute("CREATE TABLE held (x INTEGER)")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("INSERT INTO held VALUES (1)")
    args = ["-m", "memx_hpc", "search", "--site", str(ROOT / "site_configs" / "local.yaml"), "--analytic",
            "--job", str(ROOT / "jobs" / "tiny-gpt.yaml"), "--store", str(tmp_path / "store.h5"),
            "--out", str(tmp_path / "out"), "--max-stages", "2", "--mpi"]
    t0 = time.monotonic()
    try:
        proc = subprocess.run([mpiexec, "-n", "2", sys.executable, *args], capture_output=True, text=True,
                              env=_env(), timeout=PredictionCache.timeout_s + 180)
    finally:
        elapsed = time.monotonic() - t0
        holder.execute("ROLLBACK")
        holder.close()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.count(str(cache)) >= 2 and "Traceback" not in proc.stderr  # both ranks said why
    assert "locked" in proc.stderr
    assert elapsed < PredictionCache.timeout_s + 120, elapsed  # the busy timeout, then both stop
    assert not (tmp_path / "out").exists()


#: Runs memx-hpc's main() on every rank; the rank MPICH numbers 1 says on stderr which heavy
#: modules it imported.
IDLE_PROBE = r"""
import json, os, sys
from memx_hpc.cli.main import main
rc = main(sys.argv[1:])
if os.environ.get("PMI_RANK") == "1":
    heavy = ("numpy", "h5py", "xgboost", "matplotlib", "memx_hpc.model", "memx_hpc.search.engine",
             "memx_hpc.planner.conductor")
    print("rank 1 imported: " + json.dumps([m for m in heavy if m in sys.modules]), file=sys.stderr)
sys.exit(rc)
"""


@pytest.mark.parametrize("command", ["plan", "search"])
def test_a_rank_left_idle_imports_nothing_heavy(tmp_path, mpiexec, command):
    """Rank 0 alone counts the space; the idle rank waits for its word before importing the
    planner's rooms (numpy, the cost model, the search), so 2 ranks cost one rank plus an
    interpreter and MPI's start."""
    args = [command, "--site", str(ROOT / "site_configs" / "local.yaml"), "--job", str(ROOT / "jobs" / "tiny-gpt.yaml"),
            "--store", str(tmp_path / "store.h5"), "--out", str(tmp_path / "out"), "--max-stages", "2", "--json",
            "--mpi", *(["--no-profile"] if command == "plan" else [])]
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", IDLE_PROBE, *args], capture_output=True,
                          text=True, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank 1 imported: []" in proc.stderr, proc.stderr[-3000:]
    assert [n for n in json.loads(proc.stdout)["notes"] if n.startswith("MPI: 2 ranks were started")]


@pytest.mark.parametrize("case", ["site-missing", "resume-shell-unsafe"])
def test_an_error_on_rank_0_before_it_decides_stops_the_waiting_rank(tmp_path, mpiexec, case):
    """Rank 0 fails before it could tell the other ranks whether they search (a site file that
    is not there: while counting the space; a --resume folder with shell characters: while
    building its request): the waiting rank stops with the same error, exit 1, no traceback."""
    site = str(tmp_path / "no-such-site.yaml") if case == "site-missing" else str(ROOT / "site_configs" / "local.yaml")
    args = ["-m", "memx_hpc", "plan", "--site", site, "--job", str(ROOT / "jobs" / "tiny-gpt.yaml"),
            "--store", str(tmp_path / "store.h5"), "--out", str(tmp_path / "out"), "--no-profile", "--mpi"]
    needle = "no-such-site.yaml"
    if case == "resume-shell-unsafe":
        ck = tmp_path / "ck$(touch x)"
        ck.mkdir()
        args += ["--resume", str(ck)]
        needle = "not a plain path"
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, *args], capture_output=True, text=True, env=_env(),
                          timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.count(needle) >= 2 and "Traceback" not in proc.stderr  # both ranks said why
    assert not (tmp_path / "out").exists() and not (tmp_path / "x").exists()
