"""How fast the command line answers: ``predict``, ``fit`` and ``plan`` (cold and warm) and
``plan`` under ``mpiexec -n 2``, this tree beside a previous release, in one run.

The previous release (``--prev``, default 28c3378) is extracted with ``git archive`` into a
temporary folder and run with the same Python, each tree on its own store imported from the
shared Sailor and Cephalo profiles (``../shared/data``; MIT licence), so neither reuses a
predictor or a cache the other wrote. Commands of both trees alternate, so that both see the
machine in the same state; on a shared machine read the ratios, not the seconds. CPU time
(user + system of the command's process tree) is printed beside wall time: it is what other
work on the machine inflates least.

Rows (the cross-vendor example site, jobs/llama2-7b.yaml, its recommended plan):
  help          memx-hpc --help
  predict cold  the first predict on a fresh store: fits and saves the predictor
  predict warm  predict again (the goal: under 1 s on a quiet machine)
  fit           memx-hpc fit (cross-validation, then the fit; the goal: under 10 s)
  plan cold     plan with an empty signature cache; plan warm: plan again (the goal: under
                1.5 s; it reuses the store's snapshot, the predictor, the signature cache and,
                when the figure shows what the last run's did, that run's pareto.png)
  plan 1 rank / plan 2 ranks   local.yaml's tiny-gpt space, --no-profile, serially and under
                the venv's mpiexec -n 2 --mpi (the goal: 2 ranks never slower than one)
  plan mpiexec -n 1  the same under mpiexec -n 1 (without --mpi, which refuses one rank): what
                the launcher and MPI's start cost

Then whether both trees gave the same answers: the predicted iteration time and per-stage
times of the plan, and the three picks of each plan run (this tree's later work on the
model, where there is any, shows up here as a difference).

Run from the repository root:
  .venv/bin/python benchmarks/cli_speed.py [--prev REV] [--repeat N] [--skip fit,mpi]
(e.g. --prev main on a branch: the branch beside what it would change)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: Runs memx-hpc's main() from the tree on sys.path[0] (PYTHONPATH), not the installed package.
MAIN = "import sys; from memx_hpc.cli.main import main; sys.exit(main(sys.argv[1:]))"
STEPS = ("predict", "fit", "plan", "mpi")
#: Seconds a warm plan of the cross-vendor example should take (project issue 27, item 4).
PLAN_WARM_GOAL_S = 1.5


def _run(cmd: list[str], *, tree: Path, env: dict, out: Path | None = None) -> tuple[float, float, str]:
    """Wall and CPU seconds of ``cmd`` (its process tree), and its stdout; stops on failure."""
    t0 = time.perf_counter()
    with open(out or os.devnull, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stdout, stderr = proc.communicate()
        fh.write(stdout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"cli_speed: {' '.join(cmd[-12:])} (in {tree}) exited {proc.returncode}:\n{stderr[-2000:]}")
    return wall, _children_cpu(), stdout


_CPU_SEEN = [0.0]


def _children_cpu() -> float:
    """CPU seconds of the children that finished since the last call."""
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = r.ru_utime + r.ru_stime
    delta, _CPU_SEEN[0] = total - _CPU_SEEN[0], total
    return delta


class Tree:
    """One source tree (this one or the extracted previous release) with its own store."""

    def __init__(self, name: str, root: Path, work: Path, shared: Path) -> None:
        self.name, self.root, self.work = name, root, work
        work.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ, PYTHONPATH=str(root), MEMX_SHARED_DATA=str(shared), OMP_NUM_THREADS="1")
        # PYTHONDONTWRITEBYTECODE: a user's install keeps its compiled modules; without them every
        # command compiles the package again (about 0.4 s of a warm plan here)
        for v in ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS",
                  "PYTHONDONTWRITEBYTECODE"):
            self.env.pop(v, None)
        self.store = work / "xv-store.h5"
        self.site = root / "site_configs" / "example-cross-vendor.yaml"
        self.job = root / "jobs" / "llama2-7b.yaml"

    def cli(self, *args: str, mpi: int = 0, out: Path | None = None) -> tuple[float, float, str]:
        cmd = [sys.executable, "-c", MAIN, *args]
        if mpi:
            cmd = [str(Path(sys.executable).parent / "mpiexec"), "-n", str(mpi)] + cmd
        return _run(cmd, tree=self.root, env=self.env, out=out)

    def xv(self) -> list[str]:
        return ["--site", str(self.site), "--job", str(self.job), "--store", str(self.store)]


def _extract(rev: str, into: Path) -> Path:
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        sys.exit(f"cli_speed: cannot extract {rev} with git archive: {getattr(e, 'stderr', b'') or e}")
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    # site_configs/local.yaml names the nodes' Python as .venv/bin/python, relative to the tree
    (into / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    return into


def _picks(summary: str) -> dict:
    """The three picks: each plan (as its plan file writes it) and its predicted iteration ms."""
    d = json.loads(summary)
    return {role: (json.dumps(d[role]["plan"], sort_keys=True), round(d[role]["prediction"]["iteration_ms"], 6))
            if d.get(role) else None for role in ("recommended", "fastest", "weighted")}


def _predicted(out: str) -> tuple:
    d = json.loads(out)
    return (round(d["iteration_ms"], 6), tuple(round(x, 6) for x in d["stage_ms"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prev", default="28c3378", metavar="REV", help="the release to compare with (default 28c3378)")
    ap.add_argument("--repeat", type=int, default=3, metavar="N", help="warm runs per command (median; default 3)")
    ap.add_argument("--skip", default="", metavar="LIST", help=f"steps to leave out, of {', '.join(STEPS)}")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (default: a temporary folder)")
    args = ap.parse_args(argv)
    skip = {s for s in args.skip.split(",") if s}
    if skip - set(STEPS):
        ap.error(f"--skip: unknown step(s) {', '.join(sorted(skip - set(STEPS)))}; allowed: {', '.join(STEPS)}")
    from memx_hpc.datapaths import shared_data
    try:
        shared = shared_data()
    except Exception as e:  # noqa: BLE001 (one line, not a traceback)
        sys.exit(f"cli_speed: {e}")

    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="memx-cli-speed-"))
    try:
        trees = [Tree("this", ROOT, base / "this", shared),
                 Tree(f"prev {args.prev}", _extract(args.prev, base / "prev-src"), base / "prev", shared)]
        rows: list[tuple[str, list[tuple[float, float]]]] = []
        answers: dict[str, list] = {}

        def row(label: str, fn, repeat: int = 1) -> list[str]:
            """``fn(tree) -> (wall, cpu, stdout)`` on both trees alternately, ``repeat`` times."""
            runs: list[list[tuple[float, float]]] = [[], []]
            outs = ["", ""]
            for _ in range(repeat):
                for i, t in enumerate(trees):
                    w, c, outs[i] = fn(t)
                    runs[i].append((w, c))
            rows.append((label, [(statistics.median(w for w, _ in r), statistics.median(c for _, c in r))
                                 for r in runs]))
            print(f"  {label}: " + "; ".join(f"{t.name} {m[0]:.2f} s wall, {m[1]:.2f} s CPU"
                                              for t, m in zip(trees, rows[-1][1])), file=sys.stderr, flush=True)
            return outs

        row("help", lambda t: t.cli("--help"), args.repeat)
        for t in trees:  # the stores (not timed as a command of interest)
            t.cli("profile", "import", "--store", str(t.store), "--format", "sailor", str(shared / "sailor"))
            t.cli("profile", "import", "--store", str(t.store), "--format", "cephalo",
                  str(shared / "cephalo" / "model_latencies.json"))
        plan_file = ROOT / "tests" / "golden" / "plans" / "cross-vendor-llama2-7b.json"
        if "predict" not in skip:
            def predict(t):
                return t.cli("predict", *t.xv(), "--plan", str(plan_file), "--json")
            answers["predict cold"] = [_predicted(o) for o in row("predict cold", predict)]
            answers["predict warm"] = [_predicted(o) for o in row("predict warm", predict, args.repeat)]
        if "fit" not in skip:
            row("fit", lambda t: t.cli("fit", "--site", str(t.site), "--store", str(t.store),
                                       "--out", str(t.work / "fit.ubj")))
        if "plan" not in skip:
            def plan(t):
                return t.cli("plan", *t.xv(), "--no-profile", "--out", str(t.work / "plans"), "--json")
            answers["plan cold"] = [_picks(o) for o in row("plan cold", plan)]
            answers["plan warm"] = [_picks(o) for o in row("plan warm", plan, args.repeat)]
        if "mpi" not in skip:
            def local(t, n, launcher: bool = False):
                return t.cli("plan", "--site", str(t.root / "site_configs" / "local.yaml"),
                             "--job", str(t.root / "jobs" / "tiny-gpt.yaml"), "--store", str(t.work / "local.h5"),
                             "--no-profile", "--out", str(t.work / f"local-{n}"), "--json",
                             *(["--mpi"] if n > 1 else []), mpi=n if n > 1 or launcher else 0)
            answers["plan 1 rank"] = [_picks(o) for o in row("plan 1 rank", lambda t: local(t, 1), args.repeat)]
            answers["plan 2 ranks"] = [_picks(o) for o in row("plan 2 ranks", lambda t: local(t, 2), args.repeat)]
            # what mpiexec and MPI's start cost by themselves: one rank under the launcher
            answers["plan mpiexec -n 1"] = [_picks(o) for o in row("plan mpiexec -n 1",
                                                                   lambda t: local(t, 1, launcher=True), args.repeat)]
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)

    names = [t.name for t in trees]
    print(f"{'command':<14}  {names[0] + ' wall':>10}  {'CPU':>7}  {names[1] + ' wall':>20}  {'CPU':>7}  "
          f"{'wall ratio':>10}  {'CPU ratio':>9}")
    print(f"{'-' * 14}  {'-' * 10}  {'-' * 7}  {'-' * 20}  {'-' * 7}  {'-' * 10}  {'-' * 9}")
    for label, ((w0, c0), (w1, c1)) in rows:
        print(f"{label:<14}  {w0:>8.2f} s  {c0:>5.2f} s  {w1:>18.2f} s  {c1:>5.2f} s  {w0 / w1:>10.2f}  "
              f"{(c0 / c1 if c1 > 0 else float('nan')):>9.2f}")
    print(f"(medians of {args.repeat} runs for help and the warm rows; one run for the cold rows and fit; "
          f"ratio: this / {names[1]})")
    by = {label: m for label, m in rows}
    if "predict warm" in by:
        h = by["help"][0][0]
        print(f"predict warm: {by['predict warm'][0][0] / h:.0f}x memx-hpc --help here "
              f"({by['predict warm'][1][0] / by['help'][1][0]:.0f}x in {names[1]})")
    if "plan warm" in by:
        h = by["help"][0][0]
        print(f"plan warm: {by['plan warm'][0][0] / h:.0f}x memx-hpc --help here "
              f"({by['plan warm'][1][0] / by['help'][1][0]:.0f}x in {names[1]}); "
              f"CPU {by['plan warm'][0][1]:.2f} s here, {by['plan warm'][1][1]:.2f} s in {names[1]}")
        w = by["plan warm"][0][0]
        print(f"plan warm (goal: under {PLAN_WARM_GOAL_S} s): {w:.2f} s wall, {by['plan warm'][0][1]:.2f} s CPU here: "
              f"{'met' if w < PLAN_WARM_GOAL_S else 'not met'}")
    if "plan 1 rank" in by:
        one, two = by["plan 1 rank"][0][0], by["plan 2 ranks"][0][0]
        print(f"2 ranks never slower than one (goal: ratio <= 1): {two / one:.2f} here (wall), "
              f"{'met' if two <= one else 'not met'}")
        if "plan mpiexec -n 1" in by:
            under = by["plan mpiexec -n 1"][0][0]
            print(f"  against one rank under mpiexec -n 1 (the launcher's and MPI's start paid by both): "
                  f"{two / under:.2f}; mpiexec -n 1 against a plain run: {under / one:.2f}")
        print(f"local plan, 2 ranks against 1 (wall): {two / one:.2f} here, "
              f"{by['plan 2 ranks'][1][0] / by['plan 1 rank'][1][0]:.2f} in {names[1]}; (CPU): "
              f"{by['plan 2 ranks'][0][1] / by['plan 1 rank'][0][1]:.2f} here, "
              f"{by['plan 2 ranks'][1][1] / by['plan 1 rank'][1][1]:.2f} in {names[1]}")
    for label, (a, b) in answers.items():
        print(f"{label}: {'same answers in both trees' if a == b else f'answers differ: {a} / {b}'}")
    if "plan 1 rank" in answers:
        same = answers["plan 1 rank"][0] == answers["plan 2 ranks"][0]
        print(f"local plan: 2 ranks {'pick the same three plans as' if same else 'DIFFER from'} 1 rank (this tree)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
