"""Hostile inputs and faults, run through the command line.

Each row of the table builds its files in a fresh folder, runs ``memx-hpc`` (``main(argv)``,
in this process) and asserts the exit code (0 success, 1 bad input, 2 system fault), that
stderr names the field or the path, that no traceback is printed, and, where a profile
store is involved, that the store still opens with exactly the samples it held before.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from memx_hpc.cli.main import main
from memx_hpc.profile.csvio import write_csv
from memx_hpc.profile.store import ProfileStore
from memx_hpc.spec import LayerSample, LayerShape, ProfilePoint

ROOT = Path(__file__).resolve().parents[2]

SITE = """\
name: hostile
store: store.h5
partitions:
  - {name: a, gpu_type: A100-80, nodes: 1, gpus_per_node: 2}
  - {name: b, gpu_type: V100-32, nodes: 1, gpus_per_node: 2}
"""
JOB = """\
name: tiny
model: {preset: tiny-gpt}
global_batch_size: 8
precision: fp32
micro_batch_sizes: [1, 2]
"""
GPU = """\
gpu_types:
  X1:
    vendor: amd
    memory_gib: {memory}
    peak_tflops_bf16: {tflops}
    peak_tflops_fp32: 10
    hbm_gbps: {hbm}
    link_gbps: 100
    aliases: [{alias}]
"""
PLAN = {"format": "memx-plan/1", "tp": 1, "dp": 1, "micro_batch_size": 1, "global_batch_size": 8,
        "sequence_parallel": False, "stages": [{"partition": "a", "num_layers": 4, "recompute": "none"}]}
# A place no process can create files in, root included (proc is not a writable file system).
UNWRITABLE = "/proc/memx-hpc-no-such-dir"
SHAPE = LayerShape(hidden_size=64, num_attention_heads=4, num_query_groups=4, ffn_hidden_size=256, seq_length=32,
                   vocab_size=512)


def sample(mbs: int = 1, fwd: float = 1.0, gpu: str = "A100-80") -> LayerSample:
    return LayerSample(point=ProfilePoint(gpu_type=gpu, kind="layer", shape=SHAPE, micro_batch_size=mbs),
                       forward_ms=fwd, backward_ms=2 * fwd, activation_bytes=1000 * mbs, origin="imported",
                       source="hostile-test")


def w(tmp: Path, name: str, text: str | bytes) -> str:
    p = tmp / name
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8")
    return str(p)


def site(tmp: Path, extra: str = "", *, text: str | None = None) -> str:
    return w(tmp, "site.yaml", (SITE if text is None else text) + extra)


def job(tmp: Path, text: str = JOB) -> str:
    return w(tmp, "job.yaml", text)


def gpu_site(tmp: Path, memory: str = "64", tflops: str = "100", hbm: str = "1000", alias: str = "x1-board") -> str:
    text = SITE.replace("gpu_type: A100-80", "gpu_type: X1") + GPU.format(memory=memory, tflops=tflops, hbm=hbm,
                                                                          alias=alias)
    return site(tmp, text=text)


def plan(tmp: Path, text: str) -> str:
    return w(tmp, "plan.json", text)


def csv_rows(tmp: Path, **override: str) -> str:
    """A one-sample CSV file with some cells replaced by hostile text."""
    p = tmp / "good.csv"
    write_csv([sample(mbs=7)], p)
    header, row = p.read_text(encoding="utf-8").splitlines()[:2]
    cells = dict(zip(header.split(","), row.split(",")))
    cells.update(override)
    return w(tmp, "in.csv", ",".join(cells) + "\n" + ",".join(cells.values()) + "\n")


def fifo(tmp: Path, name: str) -> str:
    """A FIFO no one writes to: a read of it would wait forever."""
    os.mkfifo(tmp / name)
    return str(tmp / name)


def link(tmp: Path, name: str, target: str) -> str:
    (tmp / name).symlink_to(target)
    return str(tmp / name)


def nul_digest_sample() -> LayerSample:
    """A sample whose row digest ends in a NUL byte (about one in 256 does), which numpy's
    S32 items drop when the stored digests are read back."""
    from memx_hpc.profile.store import _row_digest, sample_to_row

    for i in range(1, 10_000):
        s = sample(mbs=5, fwd=1.0 + i / 1024)
        if _row_digest(sample_to_row(s)).endswith("00"):
            return s
    raise AssertionError("no sample with a digest ending in NUL")


def csv_twice(tmp: Path) -> list[str]:
    write_csv([nul_digest_sample()], tmp / "nul.csv")
    argv = ["profile", "--store", str(tmp / "store.h5"), "import", "--format", "csv", str(tmp / "nul.csv")]
    assert main(argv) == 0
    return argv


def holds_one_sample(tmp: Path) -> None:
    assert len(ProfileStore(tmp / "store.h5").samples()) == 1


def dead_temporaries(tmp: Path) -> bool:
    """What a fit killed inside ``Predictor.save`` leaves (a dead PID's temporary files), and
    one of a writer that still runs (this process's parent), which must stay."""
    dead = _dead_pid()
    for name in (f".p.{dead}-0123abcd.tmp.ubj", f".p.part1.{dead}-0123abcd.tmp.ubj",
                 f".p.{os.getppid()}-0123abcd.tmp.ubj"):
        w(tmp, name, b"half a model")
    return True


def only_live_temporaries(tmp: Path) -> None:
    assert sorted(p.name for p in tmp.glob(".p.*.tmp.ubj")) == [f".p.{os.getppid()}-0123abcd.tmp.ubj"]


IMPORT_ONE = ["profile", "--store", "store.h5", "import", "--format", "csv", "one.csv"]


def _damage(f, how: str) -> None:
    import numpy as np

    g = f["gpu/A100-80"]
    if how == "gpu-dataset":
        del f["gpu"]
        f["gpu"] = np.arange(3)
    elif how == "gpu-missing":
        del f["gpu"]
    elif how == "version-text":
        f.attrs["schema_version"] = "four"
    elif how == "flag-array":
        f.attrs["append_in_progress"] = np.arange(3)
    elif how == "count-array":
        g.attrs["committed_rows"] = np.arange(3)
    elif how == "count-negative":
        g.attrs["committed_rows"] = -5
    elif how == "column-group":
        del g["tp"]
        g.create_group("tp")
    elif how == "column-2d":
        del g["tp"]
        g["tp"] = np.zeros((3, 2))
    elif how == "table-dataset":
        f["gpu/junk"] = np.arange(3)
    elif how == "e2e-dataset":
        del f["e2e"]
        f["e2e"] = np.arange(3)
    elif how == "ends-backwards":
        ends = g["kind.end"][:]
        ends[2] = 0
        g["kind.end"][:] = ends
    elif how == "figures-array":
        g.attrs["device_figures"] = np.arange(3)
    elif how == "unknown-kind":
        data = g["kind.utf8"][:]
        data[:5] = np.frombuffer(b"lazer", dtype=np.uint8)
        g["kind.utf8"][:] = data
    else:
        raise AssertionError(how)


def damaged(tmp: Path, how: str, argv: list[str]) -> list[str]:
    """A store of three samples whose file was then damaged one way; its bytes are kept to
    check that the command left them as they were."""
    import hashlib

    import h5py

    path = tmp / "store.h5"
    ProfileStore(path).append([sample(1), sample(2, fwd=1.8), sample(4, fwd=3.1)])
    with h5py.File(path, "r+") as f:
        _damage(f, how)
    write_csv([sample(9)], tmp / "one.csv")
    (tmp / "store.sha256").write_text(hashlib.sha256(path.read_bytes()).hexdigest())
    return argv


def unchanged(tmp: Path) -> None:
    import hashlib

    assert hashlib.sha256((tmp / "store.h5").read_bytes()).hexdigest() == (tmp / "store.sha256").read_text()
    assert not (tmp / "store.h5.lock").exists()


def latest_is_complete(out: Path) -> None:
    """``latest`` names a run whose summary and Pareto plot were written."""
    run = out / "latest"
    assert (run / "summary.json").is_file() and (run / "pareto.png").is_file(), sorted(out.rglob("*"))
    assert json.loads((run / "summary.json").read_text())["site"].startswith("a $")


def capped_plan_files(tmp: Path) -> None:
    from memx_hpc.search.report import MAX_PLAN_FILES

    run = tmp / "out" / "latest"
    summary = json.loads((run / "summary.json").read_text())
    assert len(summary["top"]) > MAX_PLAN_FILES  # more ranked than written, else the case shows nothing
    assert len(list(run.glob("plan-*.json"))) == MAX_PLAN_FILES
    assert any("plan files written for the first" in n for n in summary["notes"])


def alias_bomb() -> str:
    text, prev = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n', "a"
    for c in "bcdefghi":
        text += f"{c}: &{c} [" + ",".join([f"*{prev}"] * 9) + "]\n"
        prev = c
    return text


def searched(tmp: Path) -> list[str]:
    """Run one analytic search so that the prediction cache exists; return the search argv."""
    argv = ["search", "--site", site(tmp), "--job", job(tmp), "--analytic", "--top", "1", "--out", str(tmp / "out")]
    assert main(argv) == 0
    return argv


def damage_cache_rows(tmp: Path) -> list[str]:
    import sqlite3

    argv = searched(tmp)
    con = sqlite3.connect(str(tmp / "store.cache.sqlite"))
    con.execute("UPDATE predictions SET time_ms = 'fast' WHERE rowid IN (SELECT rowid FROM predictions LIMIT 3)")
    con.commit()
    con.close()
    return argv


def cache_rows_are_numbers(tmp: Path) -> None:
    import sqlite3

    con = sqlite3.connect(str(tmp / "store.cache.sqlite"))
    kinds = {r[0] for r in con.execute("SELECT typeof(time_ms) FROM predictions")}
    con.close()
    assert kinds == {"real"}, kinds  # the damaged rows were predicted again and replaced


def ledger(tmp: Path, text: str) -> list[str]:
    w(tmp, "store.h5.jobs.json", text)
    return ["profile", "--site", site(tmp), "--job", job(tmp), "--no-progress"]


@dataclass(frozen=True)
class Case:
    id: str
    argv: Callable[[Path], list[str]]
    code: int
    needles: tuple[str, ...]  # each must appear in stderr ("{tmp}" is the case's folder)
    store: bool = False  # the case's folder holds a store of 3 samples that must come out intact
    check: Callable[[Path], None] | None = None


def V(kind: str, path: str) -> list[str]:
    return ["validate", f"--{kind}", path]


CASES = [
    # ---------------------------------------------------------------- documents: size, depth, aliases, keys
    Case("yaml-duplicate-key", lambda t: V("site", site(t, "name: other\n")), 1, ("site.yaml", "name", "given twice")),
    Case("yaml-duplicate-key-nested", lambda t: V("job", job(t, JOB.replace("precision: fp32", "precision: fp32\n"
                                                                              "precision: bf16"))),
         1, ("job.yaml", "precision", "given twice")),
    Case("yaml-alias-bomb", lambda t: V("site", site(t, text=alias_bomb())), 1, ("site.yaml", "aliases expand")),
    Case("yaml-deep-nesting", lambda t: V("site", site(t, text="a: " + "[" * 5000 + "]" * 5000)), 1,
         ("site.yaml", "nested deeper")),
    Case("yaml-5001-digit-integer", lambda t: V("job", job(t, JOB.replace("8", "9" * 5001, 1))), 1,
         ("job.yaml", "global_batch_size", "5,001 digits")),
    Case("yaml-not-utf8", lambda t: V("site", w(t, "site.yaml", b"name: \xff\xfe\n")), 1, ("site.yaml", "UTF-8")),
    Case("yaml-is-a-folder", lambda t: V("site", str((t / "dir.yaml").mkdir() or t / "dir.yaml")), 1,
         ("dir.yaml", "folder")),
    Case("yaml-too-large", lambda t: V("site", w(t, "site.yaml", "#" * (9 * 2**20))), 1, ("site.yaml", "too large")),
    Case("yaml-is-dev-zero", lambda t: V("site", "/dev/zero"), 1, ("/dev/zero", "character device", "regular files")),
    Case("yaml-is-a-fifo", lambda t: V("site", fifo(t, "site.yaml")), 1, ("site.yaml", "FIFO")),
    Case("yaml-links-to-dev-zero", lambda t: V("job", link(t, "job.yaml", "/dev/zero")), 1, ("job.yaml", "character device")),
    Case("yaml-empty", lambda t: V("site", site(t, text="")), 1, ("site.yaml", "expected a site mapping")),
    # ---------------------------------------------------------------- physical ranges
    Case("gpu-memory-1e300", lambda t: V("site", gpu_site(t, memory="1.0e+300")), 1,
         ("site.yaml", "gpu_types.X1.memory_gib")),
    Case("gpu-memory-1e-300", lambda t: V("site", gpu_site(t, memory="1.0e-300")), 1,
         ("site.yaml", "gpu_types.X1.memory_gib")),
    Case("gpu-negative-bandwidth", lambda t: V("site", gpu_site(t, hbm="-5")), 1, ("gpu_types.X1.hbm_gbps",)),
    Case("gpu-zero-tflops", lambda t: V("site", gpu_site(t, tflops="0")), 1, ("gpu_types.X1.peak_tflops_bf16",)),
    Case("partition-nodes-10e30", lambda t: V("site", site(t, text=SITE.replace("nodes: 1", "nodes: " + "1" + "0" * 30, 1))),
         1, ("partitions[0].nodes",)),
    Case("partition-zero-bandwidth", lambda t: V("site", site(t, text=SITE.replace("gpus_per_node: 2}",
                                                                                    "gpus_per_node: 2, inter_node_gbps: 0}", 1))),
         1, ("partitions[0].inter_node_gbps",)),
    Case("too-many-partitions", lambda t: V("site", site(t, text="name: wide\npartitions:\n" + "".join(
        f"  - {{name: p{i}, gpu_type: T4, nodes: 1, gpus_per_node: 1}}\n" for i in range(65)))), 1,
        ("partitions", "at most 64")),
    Case("job-batch-2^64", lambda t: V("job", job(t, JOB.replace("global_batch_size: 8", f"global_batch_size: {2**64}"))),
         1, ("job.yaml", "global_batch_size")),
    Case("job-train-iters-10e30", lambda t: V("job", job(t, JOB + "train_iters: 1" + "0" * 30 + "\n")), 1,
         ("train_iters",)),
    Case("job-65-micro-batch-sizes", lambda t: V("job", job(t, JOB.replace("global_batch_size: 8", "global_batch_size: 55440")
                                                             .replace("[1, 2]", str([d for d in range(1, 55441) if 55440 % d == 0][:65])))),
         1, ("micro_batch_sizes", "at most 64")),
    Case("model-hidden-2^40", lambda t: V("job", job(t, JOB.replace("{preset: tiny-gpt}", "{preset: tiny-gpt, hidden_size: "
                                                                    f"{2**40}}}"))), 1, ("model.hidden_size",)),
    # ---------------------------------------------------------------- names used as folder and file names
    Case("job-name-traversal", lambda t: V("job", job(t, JOB.replace("name: tiny", "name: x/../../.."))), 1,
         ("job.yaml", "name", "not a safe name")),
    Case("job-name-option", lambda t: V("job", job(t, JOB.replace("name: tiny", "name: -rf"))), 1, ("name",)),
    Case("job-name-nul", lambda t: V("job", job(t, JOB.replace("name: tiny", 'name: "a\\0b"'))), 1, ("name",)),
    Case("job-name-traversal-search", lambda t: ["search", "--site", site(t), "--analytic", "--job",
                                                 job(t, JOB.replace("name: tiny", "name: ../../escape"))],
         1, ("name", "not a safe name"), check=lambda t: not (t.parent / "escape").exists() or pytest.fail("escaped")),
    Case("partition-name-dotdot", lambda t: V("site", site(t, text=SITE.replace("name: a,", "name: ..,"))), 1,
         ("partitions[0].name",)),
    Case("gpu-type-name-slash", lambda t: V("site", site(t, text=SITE.replace("gpu_type: A100-80", "gpu_type: a/b")
                                                         + GPU.replace("X1:", "a/b:").format(memory=8, tflops=1, hbm=1,
                                                                                             alias="ab"))), 1,
         ("gpu_types.a/b.name", "not a safe name")),
    # ---------------------------------------------------------------- what reaches a shell: refused at load, not by render
    Case("env-value-newline", lambda t: V("site", site(t, text=SITE.replace("gpus_per_node: 2}", 'gpus_per_node: 2, '
                                                                            'env: {FOO: "x\\ny"}}', 1))),
         1, ("site.yaml", "partitions[0].env.FOO", "single line")),
    Case("pipeline-env-value-newline", lambda t: V("site", site(t, 'pipeline_comm: {env: {UCC_TLS: "ucp\\rx"}}\n')),
         1, ("site.yaml", "pipeline_comm.env.UCC_TLS", "single line")),
    Case("data-path-newline", lambda t: V("job", job(t, JOB + 'data: {paths: ["/data/mix\\n"], tokenizer: '
                                                             '{type: NullTokenizer}}\n')),
         1, ("job.yaml", "data.paths[0]", "not a plain path")),
    Case("python-newline", lambda t: V("site", site(t, text=SITE.replace("gpus_per_node: 2}", 'gpus_per_node: 2, '
                                                                         'python: "/usr/bin/python3\\n"}', 1))),
         1, ("site.yaml", "partitions[0].python")),
    Case("python-relative-names-no-file", lambda t: V("site", site(t, text=SITE.replace(
        "gpus_per_node: 2}", "gpus_per_node: 2, python: ../elsewhere/bin/python}", 1))),
         1, ("site.yaml", "partitions[0].python", "../elsewhere/bin/python", "absolute path")),
    # ---------------------------------------------------------------- GPU alias collisions
    Case("gpu-alias-names-catalog-type", lambda t: V("site", gpu_site(t, alias="A100")), 1,
         ("gpu_types.X1.aliases[0]", "A100-80")),
    Case("gpu-alias-names-site-type", lambda t: V("site", site(t, text=SITE.replace("gpu_type: A100-80", "gpu_type: X1")
                                                               + GPU.format(memory=8, tflops=1, hbm=1, alias="X2")
                                                               + GPU.replace("gpu_types:\n", "").replace("X1:", "X2:")
                                                               .format(memory=80, tflops=1, hbm=1, alias="x2-board"))),
         1, ("gpu_types.X", "X2")),
    # ---------------------------------------------------------------- plan files (JSON)
    Case("plan-json-duplicate-key", lambda t: ["render", "--site", site(t), "--job", job(t), "--no-test-only", "--plan",
                                               plan(t, json.dumps(PLAN)[:-1] + ', "tp": 2}')], 1,
         ("plan.json", "tp", "given twice")),
    Case("plan-json-deep", lambda t: ["render", "--site", site(t), "--job", job(t), "--plan",
                                      plan(t, "[" * 100000 + "]" * 100000)], 1, ("plan.json", "nested deeper")),
    Case("plan-json-nan", lambda t: ["render", "--site", site(t), "--job", job(t), "--plan",
                                     plan(t, json.dumps(PLAN).replace('"tp": 1', '"tp": NaN'))], 1, ("plan.json", "NaN")),
    Case("plan-json-5001-digits", lambda t: ["predict", "--site", site(t), "--job", job(t), "--analytic", "--plan",
                                             plan(t, json.dumps(PLAN).replace('"global_batch_size": 8',
                                                                              '"global_batch_size": ' + "9" * 5001))],
         1, ("plan.json", "digits")),
    Case("plan-stage-partition-traversal", lambda t: ["predict", "--site", site(t), "--job", job(t), "--analytic", "--plan",
                                                      plan(t, json.dumps(PLAN).replace('"partition": "a"',
                                                                                       '"partition": "../a"'))],
         1, ("plan.json", "stages[0].partition")),
    Case("general-plan-512-stages-on-4-gpus", lambda t: [
        "predict", "--site", site(t), "--analytic", "--job", job(t, JOB.replace("{preset: tiny-gpt}",
                                                                               "{preset: tiny-gpt, num_layers: 512}")),
        "--plan", plan(t, json.dumps({"format": "memx-plan/1", "micro_batch_size": 1, "global_batch_size": 8,
                                      "stages": [{"num_layers": 1, "replicas": [{"gpu_type": "A100-80", "tp": 1}]}]
                                      * 512}))],
         1, ("plan.json", "stages", "512 GPUs", "the site has 4")),
    Case("general-plan-overfills-a-partition", lambda t: [
        "predict", "--site", site(t), "--analytic", "--job", job(t),
        "--plan", plan(t, json.dumps({"format": "memx-plan/1", "micro_batch_size": 1, "global_batch_size": 8,
                                      "stages": [{"num_layers": 4, "replicas": [
                                          {"gpu_type": "A100-80", "tp": 1, "partition": "a"}] * 3}]}))],
         1, ("plan.json", "stages", "3 GPUs on partition a, which has 2")),
    # ---------------------------------------------------------------- the search space
    Case("search-space-30-partitions", lambda t: ["search", "--analytic", "--job", job(t), "--site", site(t, text=(
        "name: wide\nstore: store.h5\npartitions:\n" + "".join(
            f"  - {{name: p{i}, gpu_type: A100-80, nodes: 2, gpus_per_node: 4}}\n" for i in range(30))))],
         1, ("search space", "--layer-granularity", "--max-stages", "--tp", "--micro-batch-sizes", "fewer partitions")),
    # ---------------------------------------------------------------- imports
    Case("csv-negative-time", lambda t: ["profile", "--store", str(t / "store.h5"), "import", "--format", "csv",
                                         csv_rows(t, forward_ms="-3.5")], 1, ("in.csv", "forward_ms"), store=True),
    Case("csv-text-for-a-number", lambda t: ["profile", "--store", str(t / "store.h5"), "import", "--format", "csv",
                                             csv_rows(t, backward_ms="fast")], 1, ("in.csv", "backward_ms"), store=True),
    Case("csv-gpu-name-slash", lambda t: ["profile", "--store", str(t / "store.h5"), "import", "--format", "csv",
                                          csv_rows(t, gpu_type="../A100")], 1, ("in.csv", "gpu_type"), store=True),
    Case("csv-5001-digit-bytes", lambda t: ["profile", "--store", str(t / "store.h5"), "import", "--format", "csv",
                                            csv_rows(t, activation_bytes="9" * 5001)], 1, ("in.csv", "activation_bytes"),
         store=True),
    Case("csv-is-a-fifo", lambda t: ["profile", "--store", str(t / "store.h5"), "import", "--format", "csv",
                                     fifo(t, "in.csv")], 1, ("in.csv", "FIFO"), store=True),
    Case("cephalo-is-dev-zero", lambda t: ["profile", "--store", str(t / "store.h5"), "import", "--format", "cephalo",
                                           link(t, "model_latencies.json", "/dev/zero")], 1,
         ("model_latencies.json", "character device"), store=True),
    Case("csv-imported-twice-adds-nothing", csv_twice, 0, (), check=holds_one_sample),
    Case("cephalo-negative-time", lambda t: ["profile", "--store", str(t / "store.h5"), "import", "--format", "cephalo",
                                             w(t, "model_latencies.json", json.dumps({"deepspeedgpt_test": {"a100x80": {
                                                 "512": {"float16": [[1.0, 0.1], [2.0, 0.2], [1.1, -2.0], [2.2, 4.1]]}}}}))],
         1, ("model_latencies.json", "forward_ms"), store=True),
    # ---------------------------------------------------------------- the profile store
    Case("store-is-a-folder", lambda t: ["profile", "--store", str((t / "s.h5").mkdir() or t / "s.h5"), "ls"], 2,
         ("{tmp}/s.h5", "folder")),
    Case("store-random-bytes", lambda t: ["profile", "--store", w(t, "s.h5", os.urandom(4096)), "ls"], 2,
         ("{tmp}/s.h5",)),
    Case("store-unwritable", lambda t: ["profile", "--store", f"{UNWRITABLE}/s.h5", "import", "--format", "csv",
                                        csv_rows(t)], 2, (UNWRITABLE,)),
    Case("store-locked", lambda t: (w(t, "store.h5.lock", f"{os.getpid()}@{socket.gethostname()}\n") and
                                    ["profile", "--store", str(t / "store.h5"), "import", "--format", "csv",
                                     csv_rows(t, micro_batch_size="9")]), 2, ("store locked by PID", "store.h5"),
         store=True),
    Case("store-lock-is-a-fifo", lambda t: (fifo(t, "store.h5.lock") and
                                            ["profile", "--store", str(t / "store.h5"), "import", "--format", "csv",
                                             csv_rows(t, micro_batch_size="9")]), 2, ("{tmp}/store.h5.lock", "FIFO"),
         store=True),
    Case("store-lock-links-to-dev-zero", lambda t: (link(t, "store.h5.lock", "/dev/zero") and
                                                    ["profile", "--store", str(t / "store.h5"), "import", "--format",
                                                     "csv", csv_rows(t, micro_batch_size="9")]), 2,
         ("{tmp}/store.h5.lock", "symbolic link"), store=True),
    # ---------------------------------------------------------------- a damaged store: exit 2 naming what is wrong
    Case("store-gpu-a-dataset", lambda t: damaged(t, "gpu-dataset", ["fit", "--site", site(t), "--no-cv"]), 2,
         ("{tmp}/store.h5", "damaged", "/gpu", "not a group"), check=unchanged),
    Case("store-gpu-missing", lambda t: damaged(t, "gpu-missing", ["profile", "--store", "store.h5", "ls"]), 2,
         ("store.h5", "damaged", "/gpu", "missing"), check=unchanged),
    Case("store-schema-version-text", lambda t: damaged(t, "version-text", IMPORT_ONE), 2,
         ("store.h5", "damaged", "schema_version", "text 'four'"), check=unchanged),
    Case("store-flag-an-array", lambda t: damaged(t, "flag-array", IMPORT_ONE), 2,
         ("store.h5", "damaged", "append_in_progress", "array"), check=unchanged),
    Case("store-count-an-array", lambda t: damaged(t, "count-array", ["fit", "--site", site(t), "--no-cv"]), 2,
         ("{tmp}/store.h5", "damaged", "committed_rows", "array"), check=unchanged),
    Case("store-count-negative", lambda t: damaged(t, "count-negative", IMPORT_ONE), 2,
         ("store.h5", "damaged", "committed_rows", "-5"), check=unchanged),
    Case("store-column-a-group", lambda t: damaged(t, "column-group", IMPORT_ONE), 2,
         ("store.h5", "damaged", "'tp'", "a group"), check=unchanged),
    Case("store-column-2d", lambda t: damaged(t, "column-2d", ["profile", "--store", "store.h5", "ls"]), 2,
         ("store.h5", "damaged", "'tp'", "shape (3, 2)"), check=unchanged),
    Case("store-table-a-dataset", lambda t: damaged(t, "table-dataset", ["profile", "--store", "store.h5", "ls"]), 2,
         ("store.h5", "damaged", "/gpu/junk"), check=unchanged),
    Case("store-e2e-a-dataset", lambda t: damaged(t, "e2e-dataset", ["profile", "--store", "store.h5", "ls"]), 2,
         ("store.h5", "damaged", "/e2e"), check=unchanged),
    Case("store-row-ends-backwards", lambda t: damaged(t, "ends-backwards", ["fit", "--site", site(t), "--no-cv"]), 2,
         ("{tmp}/store.h5", "damaged", "'kind'", "backwards"), check=unchanged),
    Case("store-figures-an-array", lambda t: damaged(t, "figures-array", ["profile", "--store", "store.h5", "ls"]), 2,
         ("store.h5", "damaged", "device_figures", "array"), check=unchanged),
    Case("store-row-unknown-kind", lambda t: damaged(t, "unknown-kind", ["fit", "--site", site(t), "--no-cv"]), 2,
         ("{tmp}/store.h5", "damaged", "/gpu/A100-80 row 0", "unknown sample kind", "lazer"), check=unchanged),
    # ---------------------------------------------------------------- the predictor file
    Case("predictor-random-bytes-is-refit", lambda t: (w(t, "p.ubj", os.urandom(2048)) and
                                                       ["fit", "--site", site(t), "--no-cv", "--out", str(t / "p.ubj")]),
         0, (), store=True, check=lambda t: (t / "p.ubj").stat().st_size > 2048 or pytest.fail("not refit")),
    Case("predictor-temporaries-of-a-killed-fit-are-removed", lambda t: (dead_temporaries(t) and
                                                                         ["fit", "--site", site(t), "--no-cv",
                                                                          "--out", str(t / "p.ubj")]),
         0, (), store=True, check=only_live_temporaries),
    Case("predictor-folder-refuses-files", lambda t: ["fit", "--site", site(t), "--no-cv", "--out", "/proc/self/p.ubj"],
         2, ("/proc/self/p.ubj", "cannot write the predictor"), store=True),
    Case("predictor-path-is-a-folder", lambda t: ["fit", "--site", site(t), "--no-cv", "--out",
                                                  str((t / "p.ubj").mkdir() or t / "p.ubj")],
         2, ("{tmp}/p.ubj",), store=True),
    Case("predictor-unwritable", lambda t: ["fit", "--site", site(t), "--no-cv", "--out", f"{UNWRITABLE}/p.ubj"], 2,
         (UNWRITABLE,), store=True),
    Case("render-default-out-is-the-plan", lambda t: ["render", "--site", site(t), "--job", job(t), "--no-test-only",
                                                      "--plan", w(t, "p.sbatch", json.dumps(PLAN))],
         1, ("--out", "replace the plan file"), check=lambda t: json.loads((t / "p.sbatch").read_text())),
    Case("render-out-is-the-plan", lambda t: ["render", "--site", site(t), "--job", job(t), "--no-test-only",
                                              "--plan", plan(t, json.dumps(PLAN)), "--out", str(t / "plan.json")],
         1, ("--out", "replace the plan file"), check=lambda t: json.loads((t / "plan.json").read_text())),
    # ---------------------------------------------------------------- the prediction cache
    Case("cache-row-with-text-is-predicted-again", damage_cache_rows, 0, (), check=cache_rows_are_numbers),
    Case("cache-path-is-a-folder", lambda t: ["search", "--analytic", "--job", job(t), "--site",
                                              site(t, f"cache: {(t / 'c.sqlite').mkdir() or t / 'c.sqlite'}\n")],
         2, ("{tmp}/c.sqlite",)),
    Case("cache-not-sqlite", lambda t: ["search", "--analytic", "--job", job(t), "--site",
                                        site(t, f"cache: {w(t, 'c.sqlite', os.urandom(8192))}\n")],
         2, ("{tmp}/c.sqlite",)),
    # ---------------------------------------------------------------- output folders
    Case("search-out-under-a-file", lambda t: ["search", "--site", site(t), "--job", job(t), "--analytic", "--out",
                                               w(t, "file.txt", "x") + "/sub"], 2, ("{tmp}/file.txt",)),
    Case("search-out-unwritable", lambda t: ["search", "--site", site(t), "--job", job(t), "--analytic", "--out",
                                             f"{UNWRITABLE}/out"], 2, (UNWRITABLE,)),
    Case("render-out-under-a-file", lambda t: ["render", "--site", site(t), "--job", job(t), "--no-test-only",
                                               "--plan", plan(t, json.dumps(PLAN)), "--out",
                                               w(t, "file.txt", "x") + "/job.sbatch"], 2, ("{tmp}/file.txt",)),
    # ---------------------------------------------------------------- the job ledger
    Case("ledger-wrong-shape", lambda t: ledger(t, json.dumps({"version": 1, "tasks": {"17": {"state": "submitted"}}})),
         2, ("job ledger", "store.h5.jobs.json", "tasks.17")),
    Case("ledger-not-json", lambda t: ledger(t, "{not json"), 2, ("job ledger", "store.h5.jobs.json")),
    Case("ledger-a-list", lambda t: ledger(t, "[1, 2]"), 2, ("job ledger", "store.h5.jobs.json")),
    Case("plan-site-name-with-mathtext", lambda t: ["plan", "--site", site(t, text=SITE.replace(
        "name: hostile", 'name: "a $\\\\frac{$ b"')), "--job", job(t), "--no-profile", "--allow-datasheet",
        "--top", "2", "--out", str(t / "out")], 0, (), check=lambda t: latest_is_complete(t / "out")),
    Case("search-top-a-billion-writes-at-most-100-plan-files", lambda t: [
        "search", "--site", site(t), "--job", job(t, JOB.replace("global_batch_size: 8", "global_batch_size: 64")
                                                  .replace("[1, 2]", "[1, 2, 4, 8]")),
        "--analytic", "--top", "1000000000", "--out", str(t / "out")], 0, (), check=lambda t: capped_plan_files(t)),
    # ---------------------------------------------------------------- extreme but allowed figures stay finite
    Case("predict-smallest-device", lambda t: ["predict", "--analytic", "--site",
                                               gpu_site(t, memory=str(2**-10), tflops="1.0e-6", hbm="1.0e-6"),
                                               "--job", job(t), "--plan", plan(t, json.dumps(PLAN))], 0, ()),
    Case("predict-largest-device", lambda t: ["predict", "--analytic", "--site",
                                              gpu_site(t, memory=str(2**20), tflops="1.0e+6", hbm="1.0e+6"),
                                              "--job", job(t), "--plan", plan(t, json.dumps(PLAN))], 0, ()),
    Case("predict-batch-beyond-bound", lambda t: ["predict", "--analytic", "--site", site(t), "--job",
                                                  job(t, JOB.replace("global_batch_size: 8", f"global_batch_size: {2**16 + 2}")),
                                                  "--plan", plan(t, json.dumps({**PLAN, "global_batch_size": 2**16 + 2}))],
         1, ("job.yaml", "global_batch_size")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_or_fault(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MEMX_STORE", raising=False)
    store = ProfileStore(tmp_path / "store.h5")
    if case.store:
        assert store.append([sample(1), sample(2, fwd=1.8), sample(4, fwd=3.1)]) == 3
        before = store.content_hash()
    argv = case.argv(tmp_path)
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == case.code, f"exit {code}, expected {case.code}: {err}"
    assert "Traceback" not in err and "[bt]" not in err  # no Python or C++ backtrace
    for needle in case.needles:
        assert needle.replace("{tmp}", str(tmp_path)) in err, f"{needle!r} not in: {err}"
    if case.code:
        last = err.strip().splitlines()[-1]
        assert last.startswith("memx-hpc ") and "error:" in last  # ends on one line a person can act on
    if case.store:
        again = ProfileStore(tmp_path / "store.h5")
        assert again.content_hash() == before and len(again.samples()) == 3
        assert not (tmp_path / "store.h5.lock").exists() or case.id.startswith("store-lock")
    if case.check:
        case.check(tmp_path)


def test_the_table_is_large_enough():
    assert len(CASES) >= 40
    assert {c.code for c in CASES} == {0, 1, 2}


def test_two_writers_of_one_predictor_file(tmp_path: Path, monkeypatch) -> None:
    """Two fits finishing at once each replace whole files: no lost temporary file, a loadable result."""
    import subprocess
    import sys

    from memx_hpc.model.predictor import Predictor

    monkeypatch.chdir(tmp_path)
    ProfileStore(tmp_path / "store.h5").append([sample(1), sample(2, fwd=1.8), sample(4, fwd=3.1)])
    assert main(["fit", "--site", site(tmp_path), "--no-cv", "--out", str(tmp_path / "p.ubj")]) == 0
    code = ("import sys\nfrom memx_hpc.model.predictor import Predictor\np = Predictor.load(sys.argv[1])\n"
            "for _ in range(10):\n    p.save(sys.argv[2])\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "p.ubj"), str(tmp_path / "q.ubj")],
                              cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for pr in procs:
        _, err = pr.communicate(timeout=300)
        assert pr.returncode == 0, err
    Predictor.load(tmp_path / "q.ubj")
    assert not list(tmp_path.glob("*.tmp.ubj"))


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def _race_for_the_lock(path: Path, held: Path, start_s: float) -> None:
    """In a forked child: take the store's lock and prove no one else holds it meanwhile."""
    import time
    import warnings

    from memx_hpc.profile.store import StoreLocked

    code = 0
    try:
        warnings.simplefilter("ignore")
        st = ProfileStore(path, lock_timeout_s=10.0)
        time.sleep(max(0.0, start_s - time.time()))  # all four start together
        st._acquire()
        try:
            fd = os.open(held, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            code = 1  # a second holder: the mark of the first is still there
        else:
            time.sleep(0.01)
            os.close(fd)
            os.unlink(held)
        st._release()
    except StoreLocked:
        code = 3
    except BaseException:
        code = 4
    os._exit(code)


def test_four_writers_break_a_stale_lock_one_at_a_time(tmp_path: Path) -> None:
    """A lock of a dead PID and four writers starting together: exactly one breaks it, and
    the lock is held by one writer at a time (two held it at once in 2 of 40 rounds when each
    writer that saw the dead holder removed whatever lock was there)."""
    import time

    for r in range(40):
        folder = tmp_path / f"round{r}"
        folder.mkdir()
        path = folder / "store.h5"
        Path(str(path) + ".lock").write_text(f"{_dead_pid()}@{socket.gethostname()}\n")
        start_s = time.time() + 0.05
        kids = []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                _race_for_the_lock(path, folder / "held", start_s)
            kids.append(pid)
        codes = [os.waitstatus_to_exitcode(os.waitpid(k, 0)[1]) for k in kids]
        assert codes == [0, 0, 0, 0], f"round {r}: {codes} (1: two holders at once, 3: locked out, 4: failed)"
        assert not Path(str(path) + ".lock").exists()


@pytest.mark.parametrize("existing", [True, False], ids=["into-a-store", "into-a-new-store"])
def test_import_with_no_room_left_names_the_store(tmp_path: Path, existing: bool) -> None:
    """A full disk met inside HDF5 crashed ``profile import`` (segfault, exit 139). The file
    size limit (RLIMIT_FSIZE) stands in for a full disk: the write is refused before HDF5
    starts it, exit 2 naming the store, and a store already there keeps its bytes."""
    import hashlib
    import resource
    import subprocess
    import sys

    store = tmp_path / "store.h5"
    if existing:
        ProfileStore(store).append([sample(1), sample(2, fwd=1.8), sample(4, fwd=3.1)])
    before = hashlib.sha256(store.read_bytes()).hexdigest() if existing else None
    write_csv([sample(m, gpu=g) for g in ("V100-32", "H100-80") for m in (1, 2, 3)], tmp_path / "in.csv")
    limit = (store.stat().st_size if existing else 0) + 200_000

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    out = subprocess.run([sys.executable, "-m", "memx_hpc", "profile", "--store", str(store), "import",
                          "--format", "csv", str(tmp_path / "in.csv")], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, preexec_fn=small_files, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr
    assert f"{store}: no room to write the profile store" in out.stderr and "file size limit" in out.stderr
    if existing:
        assert hashlib.sha256(store.read_bytes()).hexdigest() == before
    else:
        assert not store.exists()
    assert not Path(str(store) + ".lock").exists()


def test_link_curves_with_no_room_left_name_the_store(tmp_path: Path) -> None:
    """The link-curve writer (``/comm``) met a full disk inside HDF5 as the sample writers did
    before they checked for room. Under a file size limit just above the store's size it is
    refused before HDF5 starts: exit 2 naming the store, the store's bytes as they were."""
    import hashlib
    import resource
    import subprocess
    import sys

    from memx_hpc.datapaths import shared_data

    store = tmp_path / "store.h5"
    ProfileStore(store).append([sample(1), sample(2, fwd=1.8)])
    before = hashlib.sha256(store.read_bytes()).hexdigest()
    limit = store.stat().st_size + 4_000  # less than Sailor's curves take

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    code = ("import sys; from memx_hpc.errors import SystemFailure\n"
            "from memx_hpc.profile.comm import import_sailor_comm, write_comm_curves\n"
            "try:\n    write_comm_curves(sys.argv[1], import_sailor_comm(sys.argv[2]))\n"
            "except SystemFailure as e:\n    print(e, file=sys.stderr); sys.exit(2)\n")
    out = subprocess.run([sys.executable, "-c", code, str(store), str(shared_data() / "sailor")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, preexec_fn=small_files,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert f"{store}: no room to write the profile store" in out.stderr and "file size limit" in out.stderr
    assert hashlib.sha256(store.read_bytes()).hexdigest() == before
    assert not Path(str(store) + ".lock").exists()


def test_search_at_global_batch_65536_with_micro_batch_1_is_bounded(tmp_path: Path) -> None:
    """Every micro-batch of the 1F1B schedule was simulated op by op: tiny-gpt at global batch
    65,536 and micro-batch 1 did not finish in 25 minutes. It now takes seconds."""
    import subprocess
    import sys

    big = JOB.replace("global_batch_size: 8", "global_batch_size: 65536").replace("[1, 2]", "[1]")
    argv = ["search", "--site", site(tmp_path), "--job", job(tmp_path, big), "--analytic", "--top", "2",
            "--out", str(tmp_path / "out")]
    out = subprocess.run([sys.executable, "-m", "memx_hpc", *argv], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "out" / "latest" / "plan-01.json").is_file()


# ---------------------------------------------------------------------------------------------
# data and outside reads: data prepare never loses an existing dataset; tokenizer files, the
# checkpoint tracker, Slurm's answers, --json's stdout and render's paths are read or written
# within bounds and named when wrong. Rows run with small limits (MAX_DOCUMENT_BYTES 4 KiB,
# MAX_OUTPUT_BYTES 1 MiB) and with fake Slurm clients (scontrol, sinfo, sbatch) on PATH that
# print the case folder's nodes.txt / partitions.txt.

_HELD: list = []  # lock files a row holds open while memx-hpc runs


def _tok(t: Path) -> str:
    from test_data_prepare import hf_tokenizer

    return str(hf_tokenizer(t))


def _prep(t: Path, *inputs: str, prefix: str = "out/corpus", tok: str | None = None, extra: tuple = ()) -> list[str]:
    args = ["data", "prepare", "--output-prefix", str(t / prefix), "--tokenizer-type", "HuggingFaceTokenizer",
            "--tokenizer-model", tok or _tok(t), *extra]
    for i in inputs:
        args += ["--input", i]
    return args


def _with_dataset(t: Path) -> str:
    """An existing dataset at out/corpus_text_document (its bytes kept in t/before.json); the tokenizer."""
    from memx_hpc.train.prepare import prepare
    from memx_hpc.train.tokenizer import load_tokenizer

    tok = _tok(t)
    src = w(t, "good.jsonl", "".join(json.dumps({"text": f"document {i} of the corpus"}) + "\n" for i in range(50)))
    prepare([src], str(t / "out" / "corpus"), load_tokenizer("HuggingFaceTokenizer", model=tok))
    (t / "before.json").write_text(json.dumps(_dataset_bytes(t)))
    return tok


def _dataset_bytes(t: Path) -> dict[str, str]:
    import hashlib

    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((t / "out").iterdir())
            if p.suffix in (".bin", ".idx")}


def dataset_unchanged(t: Path) -> None:
    assert _dataset_bytes(t) == json.loads((t / "before.json").read_text())


def _held_lock(t: Path) -> str:
    import fcntl

    f = (t / "out" / "corpus_text_document.lock").open("w")
    fcntl.flock(f.fileno(), fcntl.LOCK_EX)
    _HELD.append(f)
    return str(t / "out" / "corpus_text_document.lock")


def _second_writer(t: Path) -> list[str]:
    """A prepare into a prefix whose lock another prepare holds."""
    tok = _with_dataset(t)
    _held_lock(t)
    return _prep(t, w(t, "new.jsonl", '{"text": "new"}\n'), tok=tok, extra=("--overwrite",))


def _tracker(t: Path, text: str) -> str:
    d = t / "ckpt"
    d.mkdir()
    (d / "latest_checkpointed_iteration.txt").write_text(text)
    return str(d)


def _slurm(t: Path, nodes: str | None = None, partitions: str | None = None) -> list[str]:
    """``site discover --out -`` against the captured local cluster, with nodes/partitions text replaced."""
    out = Path(__file__).parent / "slurm_output"
    w(t, "nodes.txt", nodes if nodes is not None else (out / "nodes-idle.txt").read_text())
    w(t, "partitions.txt", partitions if partitions is not None else (out / "partitions.txt").read_text())
    return ["site", "discover", "--out", "-"]


def _nodes_bytes(t: Path, old: bytes, new: bytes) -> list[str]:
    raw = (Path(__file__).parent / "slurm_output" / "nodes-idle.txt").read_bytes().replace(old, new, 1)
    argv = _slurm(t)
    (t / "nodes.txt").write_bytes(raw)
    return argv


_FAKE_SCONTROL = """#!/bin/sh
d=$(dirname "$0")/..
case "$2" in
  node) if [ -f "$d/endless" ]; then exec yes "NodeName=x State=IDLE"; fi; cat "$d/nodes.txt" ;;
  partition) cat "$d/partitions.txt" ;;
  reservation) echo "No reservations in the system" ;;
  config) echo "ClusterName = fake" ;;
esac
"""


def _fake_slurm(tmp: Path) -> str:
    b = tmp / "fakebin"
    b.mkdir()
    for name, text in (("scontrol", _FAKE_SCONTROL), ("sinfo", "#!/bin/sh\necho debug\n"),
                       ("sbatch", "#!/bin/sh\nexit 1\n")):
        (b / name).write_text(text)
        (b / name).chmod(0o755)
    return str(b)


def _plan5(t: Path) -> str:
    return plan(t, json.dumps({**PLAN, "stages": [{"partition": "a", "num_layers": 5, "recompute": "none"}]}))


def _bad_merges(t: Path) -> list[str]:
    from test_data_prepare import gpt2_files

    vocab, merges = gpt2_files(t)
    merges.write_text("#version: 0.2\nthree tokens here\n")
    return ["data", "prepare", "--input", w(t, "c.jsonl", '{"text": "hi"}\n'), "--output-prefix", str(t / "o"),
            "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(vocab), "--merge-file", str(merges)]


def _hf_file(t: Path, data: bytes) -> list[str]:
    return _prep(t, w(t, "c.jsonl", '{"text": "hi"}\n'), tok=w(t, "tok.json", data))


OUTSIDE_CASES = [
    # ---------------------------------------------------------------- data prepare keeps what is there
    Case("data-prepare-fails-on-line-2-keeps-the-dataset",
         lambda t: _prep(t, w(t, "bad.jsonl", '{"text": "ok"}\nnot json\n'), tok=_with_dataset(t),
                         extra=("--overwrite",)), 1, ("bad.jsonl", "line 2"), check=dataset_unchanged),
    Case("data-prepare-needs-overwrite", lambda t: _prep(t, w(t, "new.jsonl", '{"text": "new"}\n'),
                                                         tok=_with_dataset(t)),
         1, ("{tmp}/out/corpus_text_document", "--overwrite"), check=dataset_unchanged),
    Case("data-prepare-second-writer-refused", lambda t: _second_writer(t),
         2, ("{tmp}/out/corpus_text_document.lock", "another data prepare"), check=dataset_unchanged),
    Case("data-prepare-output-inside-input", lambda t: _prep(t, str((t / "corpus").mkdir() or t / "corpus"),
                                                             prefix="corpus/out/c"),
         1, ("--output-prefix", "{tmp}/corpus", "inside the input folder")),
    Case("data-prepare-empty-text-file", lambda t: _prep(t, w(t, "empty.txt", "")), 1,
         ("empty.txt", "holds no text")),
    Case("data-prepare-line-over-the-limit", lambda t: _prep(t, w(t, "long.jsonl", '{"text": "ok"}\n' + json.dumps(
        {"text": "x" * 5000}) + "\n")), 1, ("long.jsonl", "line 2", "4,096 bytes")),
    Case("data-prepare-text-file-over-the-limit", lambda t: _prep(t, w(t, "book.txt", "y" * 5000)), 1,
         ("book.txt", "split it")),
    # ---------------------------------------------------------------- tokenizer files
    Case("tokenizer-not-json", lambda t: _hf_file(t, b"{not json"), 1, ("tokenizer.model", "tok.json", "not JSON")),
    Case("tokenizer-a-json-list", lambda t: _hf_file(t, b"[1, 2]"), 1, ("tokenizer.model", "tok.json", "list")),
    Case("tokenizer-latin-1", lambda t: _hf_file(t, '{"a": "caf\u00e9"}'.encode("latin-1")), 1,
         ("tokenizer.model", "tok.json", "UTF-8")),
    Case("tokenizer-bad-merges-named", _bad_merges, 1, ("tokenizer.merge_file", "merges.txt", "line 2")),
    # ---------------------------------------------------------------- the checkpoint tracker
    Case("tracker-a-kilobyte-of-digits", lambda t: ["render", "--site", site(t), "--job", job(t), "--no-test-only",
                                                    "--plan", plan(t, json.dumps(PLAN)), "--resume",
                                                    _tracker(t, "9" * 1024)],
         1, ("--resume", "latest_checkpointed_iteration.txt", "no iteration number")),
    Case("tracker-text", lambda t: ["render", "--site", site(t), "--job", job(t), "--no-test-only", "--plan",
                                    plan(t, json.dumps(PLAN)), "--resume", _tracker(t, "twelve\n")],
         1, ("--resume", "latest_checkpointed_iteration.txt", "twelve")),
    # ---------------------------------------------------------------- Slurm's answers
    Case("hostlist-10^10-nodes", lambda t: _slurm(t, partitions=(
        Path(__file__).parent / "slurm_output" / "partitions.txt").read_text().replace(
        "Nodes=a100n0 ", "Nodes=n[0-99][0-99][0-99][0-99][0-99] ", 1)),
         2, ("n[0-99][0-99][0-99][0-99][0-99]", "more than 1,000,000", "scontrol show partition")),
    Case("hostlist-letters-in-a-range", lambda t: _slurm(t, partitions=(
        Path(__file__).parent / "slurm_output" / "partitions.txt").read_text().replace(
        "Nodes=a100n0 ", "Nodes=a100n[x-y] ", 1)), 2, ("a100n[x-y]", "'x-y'", "scontrol show partition")),
    Case("scontrol-never-stops", lambda t: (w(t, "endless", "") and _slurm(t)), 2,
         ("scontrol show node --oneliner", "more than 1 MiB")),
    Case("node-reason-latin-1", lambda t: _nodes_bytes(t, b"State=IDLE", b"State=IDLE+DRAIN Reason=caf\xe9"), 0,
         ("nvidia_a100", "1 drained")),
    Case("gres-count-10^20", lambda t: _nodes_bytes(t, b"Gres=gpu:a100:2", b"Gres=gpu:a100:" + b"1" + b"0" * 20), 0,
         ("left out nvidia_a100", "node a100n0", "gpu:a100:1" + "0" * 20)),
    # ---------------------------------------------------------------- render's paths and plan
    Case("render-out-not-utf8", lambda t: ["render", "--site", site(t), "--job", job(t), "--no-test-only", "--plan",
                                           plan(t, json.dumps(PLAN)), "--out",
                                           str(t / os.fsdecode(b"bad\xff") / "x.sbatch")],
         0, (), check=lambda t: (t / os.fsdecode(b"bad\xff") / "x.sbatch").is_file() or pytest.fail("not written")),
    Case("render-resume-shell-unsafe", lambda t: ["render", "--site", site(t), "--job", job(t), "--no-test-only",
                                                  "--plan", plan(t, json.dumps(PLAN)), "--resume",
                                                  str((t / "ck$(touch x)").mkdir() or t / "ck$(touch x)")],
         1, ("--resume", "not a plain path"), check=lambda t: not (t / "x").exists() or pytest.fail("ran")),
    Case("render-plan-5-of-4-layers", lambda t: ["render", "--site", site(t), "--job", job(t), "--no-test-only",
                                                 "--plan", _plan5(t)], 1, ("{tmp}/plan.json", "stages", "5 layers")),
    # ---------------------------------------------------------------- the profile store
    Case("store-links-to-dev-null-ls", lambda t: ["profile", "--store", link(t, "null.h5", "/dev/null"), "ls"], 2,
         ("{tmp}/null.h5", "character device")),
]


@pytest.mark.parametrize("case", OUTSIDE_CASES, ids=[c.id for c in OUTSIDE_CASES])
def test_outside_reads_and_data(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    from memx_hpc.slurm import discover
    from memx_hpc.train import prepare

    monkeypatch.setattr(prepare, "MAX_DOCUMENT_BYTES", 4096)
    monkeypatch.setattr(discover, "MAX_OUTPUT_BYTES", 2**20)
    monkeypatch.setenv("PATH", _fake_slurm(tmp_path) + os.pathsep + os.environ.get("PATH", ""))
    try:
        test_hostile_input_or_fault(case, tmp_path, capsys, monkeypatch)
    finally:
        while _HELD:
            _HELD.pop().close()


def test_json_into_a_closed_stdout_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    import sys

    monkeypatch.setattr(sys, "stdout", None)
    code = main(["validate", "--site", site(tmp_path), "--json"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and err.strip().splitlines() == [
        "memx-hpc validate: error: standard output is closed: nowhere to print the --json report"]


@pytest.mark.parametrize("command", ["plan", "predict", "search"])
def test_store_linked_to_dev_null_is_refused_by_planning(command: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    link(tmp_path, "store.h5", "/dev/null")
    argv = {"plan": ["plan", "--no-profile", "--allow-datasheet", "--out", str(tmp_path / "out")],
            "predict": ["predict", "--plan", plan(tmp_path, json.dumps(PLAN))],
            "search": ["search", "--out", str(tmp_path / "out")]}[command]
    code = main([*argv, "--site", site(tmp_path), "--job", job(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and f"{tmp_path}/store.h5" in err and "Traceback" not in err


# space: a degree list that leaves no layout names that list, not "no split fits the GPUs"

MOE_JOB = """\
name: moe
model: {preset: Mixtral-8x7B, num_layers: 4, seq_length: 1024}
global_batch_size: 8
micro_batch_sizes: [1]
expert_parallel_sizes: [2]
"""
SPACE_CASES = [
    Case("space-job-ep-outside-the-sites", lambda t: [
        "search", "--site", site(t, text="name: ep\nstore: store.h5\nexpert_parallel_sizes: [4]\npartitions:\n"
                                         "  - {name: a, gpu_type: A100-80, nodes: 1, gpus_per_node: 8}\n"),
        "--job", job(t, MOE_JOB), "--analytic", "--out", str(t / "out")],
        1, ("job.yaml", "expert_parallel_sizes", "[2]", "the site's [4]")),
    Case("space-cp-without-transformer-engine", lambda t: [
        "search", "--site", site(t, text="name: cp\nstore: store.h5\npartitions:\n  - {name: a, gpu_type: A100-80, "
                                         "nodes: 1, gpus_per_node: 4, transformer_impl: local}\n"),
        "--job", job(t, JOB + "context_parallel_sizes: [2]\n"), "--analytic", "--out", str(t / "out")],
        1, ("job.yaml", "context_parallel_sizes", "transformer_impl transformer_engine on partition a")),
]


@pytest.mark.parametrize("case", SPACE_CASES, ids=[c.id for c in SPACE_CASES])
def test_space_degree_lists_name_the_constraint(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                monkeypatch) -> None:
    test_hostile_input_or_fault(case, tmp_path, capsys, monkeypatch)


# ---------------------------------------------------------------- planner: --finish past the last date, --scale range


def test_plan_finish_beyond_the_last_date_names_finish(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                       monkeypatch) -> None:
    """``plan --finish 1G`` at a large global batch runs past year 9999: exit 1 naming
    ``--finish`` and the most it can price, before Slurm is asked (no OverflowError)."""
    import memx_hpc.planner.conductor as conductor

    monkeypatch.chdir(tmp_path)
    # Slurm's view of the cluster: every node usable (the horizon is checked before Slurm is asked)
    monkeypatch.setattr(conductor, "cluster_view", lambda comm, rank0: object())
    monkeypatch.setattr(conductor, "usable_site", lambda site, view: (site, []))
    monkeypatch.setattr("memx_hpc.slurm.local_cluster.slurm_available", lambda timeout=5.0: True)
    big = "name: big\nmodel: {preset: Llama-3.2-3B}\nglobal_batch_size: 65536\nprecision: bf16\n"
    code = main(["plan", "--site", site(tmp_path), "--job", job(tmp_path, big), "--analytic", "--no-profile",
                 "--top", "2", "--out", str(tmp_path / "out"), "--finish", "1G"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "--finish" in err and "at most" in err and "iterations" in err and "Traceback" not in err


@pytest.mark.parametrize("scale", ["10000000", "0"])
def test_simulate_scale_out_of_range_names_scale(scale: str, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                 monkeypatch) -> None:
    """``simulate --scale 10000000`` names ``--scale`` and its range, not a partition's ``nodes``."""
    monkeypatch.chdir(tmp_path)
    code = main(["simulate", "--site", site(tmp_path), "--job", job(tmp_path), "--analytic", "--scale", scale])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "--scale" in err and "Traceback" not in err
    if scale != "0":
        assert "1 to " in err and "nodes:" not in err


# spec: files the spec readers load (Hugging Face configs, large documents, a partition's
# python, the job's virtual stages)

def hf_job(tmp: Path, **bad: object) -> str:
    """A job over a copy of a published Llama config.json with ``bad`` keys replaced."""
    cfg = json.loads((ROOT / "tests" / "data" / "hf_configs" / "Llama-3.2-1B.json").read_text(encoding="utf-8"))
    w(tmp, "models/config.json", json.dumps({**cfg, **bad}))
    return job(tmp, "model: {hf_config: models/config.json, seq_length: 128}\nglobal_batch_size: 8\n")


def many_partitions(n: int) -> str:
    return "name: wide\npartitions:\n" + "".join(f"  - {{name: p{i}, gpu_type: A100-80, nodes: 1, gpus_per_node: 1}}\n"
                                                 for i in range(n))


def copied_site_with_relative_python(tmp: Path) -> str:
    """A site naming ``bin/python`` relative to it, copied out of the folder that has one (the
    case's folder, the current one), to a folder beside it: the current folder must not count."""
    w(tmp, "bin/python", "#!/bin/sh\n")
    (tmp / "bin" / "python").chmod(0o755)
    return w(tmp.parent / f"{tmp.name}-copy", "site.yaml",
             SITE.replace("gpus_per_node: 2}", "gpus_per_node: 2, python: bin/python}", 1))


def site_with_python_not_executable(tmp: Path) -> str:
    w(tmp, "conf/bin/python", "not a program\n")
    return w(tmp, "conf/site.yaml", SITE.replace("gpus_per_node: 2}", "gpus_per_node: 2, python: bin/python}", 1))


SPEC_CASES = [
    Case("hf-config-hidden-size-2^40", lambda t: V("job", hf_job(t, hidden_size=2**40)), 1,
         ("{tmp}/models/config.json: hidden_size", "must be between")),
    Case("hf-config-kv-heads-not-dividing", lambda t: V("job", hf_job(t, num_key_value_heads=7)), 1,
         ("models/config.json: num_key_value_heads", "not divisible")),
    # 12,000 partitions of 9 YAML nodes each pass the bound as 10^5 do, in a tenth of the time
    Case("site-12000-partitions-no-aliases", lambda t: V("site", site(t, text=many_partitions(12_000))), 1,
         ("site.yaml", "partitions", "12,000 entries", "more than 100,000 values (YAML nodes)")),
    Case("site-relative-python-found-only-from-cwd", lambda t: V("site", copied_site_with_relative_python(t)), 1,
         ("{tmp}-copy/site.yaml", "partitions[0].python", "bin/python", "relative to the site file")),
    Case("site-relative-python-not-executable", lambda t: V("site", site_with_python_not_executable(t)), 1,
         ("conf/site.yaml", "partitions[0].python", "not an executable file")),
    Case("job-virtual-stages-1000-for-4-layers", lambda t: V("job", job(t, JOB + "virtual_stages: [1, 1000]\n")), 1,
         ("job.yaml", "virtual_stages[1]", "1000", "largest value this model allows is 2")),
]


@pytest.mark.parametrize("case", SPEC_CASES, ids=[c.id for c in SPEC_CASES])
def test_spec_hostile_input(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    test_hostile_input_or_fault(case, tmp_path, capsys, monkeypatch)


def test_the_alias_bomb_still_blames_aliases(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(V("site", site(tmp_path, text=alias_bomb()))) == 1
    assert "aliases expand" in capsys.readouterr().err


# ---------------------------------------------------------------- fabrics: a cloud fabric's name, adapters per node


def fabric_site(tmp: Path, fabric: str, nics: str = "") -> str:
    return site(tmp, text=SITE.replace("gpus_per_node: 2}", f"gpus_per_node: 2, fabric: {fabric}{nics}}}", 1))


FABRIC_CASES = [
    Case("site-fabric-unknown", lambda t: V("site", fabric_site(t, "efa-9")), 1,
         ("site.yaml", "partitions[0].fabric", "efa-9", "did you mean", "efa, efa-200, efa-400", "gcp-tcpxo",
          "azure-ndr")),
    Case("site-fabric-adapters-65", lambda t: V("site", fabric_site(t, "efa", ", nics_per_node: 65")), 1,
         ("site.yaml", "partitions[0].nics_per_node", "found 65", "a whole number from 1 to 64")),
    Case("site-fabric-adapters-zero", lambda t: V("site", fabric_site(t, "gcp-tcpx", ", nics_per_node: 0")), 1,
         ("site.yaml", "partitions[0].nics_per_node", "found 0", "from 1 to 64")),
    Case("site-fabric-adapters-text", lambda t: V("site", fabric_site(t, "efa", ", nics_per_node: 'all; rm -rf /'")), 1,
         ("site.yaml", "partitions[0].nics_per_node",)),
]


@pytest.mark.parametrize("case", FABRIC_CASES, ids=[c.id for c in FABRIC_CASES])
def test_fabric_hostile_input(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    test_hostile_input_or_fault(case, tmp_path, capsys, monkeypatch)


# ---------------------------------------------------------------- NVLink domains: nvlink_domain_gpus


def domain_site(tmp: Path, value: str) -> str:
    return site(tmp, text=SITE.replace("gpus_per_node: 2}", f"gpus_per_node: 2, nvlink_domain_gpus: {value}}}", 1))


DOMAIN_CASES = [
    Case("site-nvlink-domain-odd", lambda t: V("site", domain_site(t, "3")), 1,
         ("site.yaml", "partitions[0].nvlink_domain_gpus", "found 3", "multiple of gpus_per_node")),
    Case("site-nvlink-domain-negative", lambda t: V("site", domain_site(t, "-72")), 1,
         ("site.yaml", "partitions[0].nvlink_domain_gpus", "-72")),
    Case("site-nvlink-domain-huge", lambda t: V("site", domain_site(t, "99999999999999999999")), 1,
         ("site.yaml", "partitions[0].nvlink_domain_gpus",)),
    Case("site-nvlink-domain-text", lambda t: V("site", domain_site(t, "'rack; rm -rf /'")), 1,
         ("site.yaml", "partitions[0].nvlink_domain_gpus",)),
]


@pytest.mark.parametrize("case", DOMAIN_CASES, ids=[c.id for c in DOMAIN_CASES])
def test_nvlink_domain_hostile_input(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    test_hostile_input_or_fault(case, tmp_path, capsys, monkeypatch)


# ---------------------------------------------------------------- cross-vendor vocabulary: a narrowing no plan can take


NARROWING_CASES = [
    Case("job-virtual-stages-without-1-on-one-stage", lambda t: [
        "search", "--analytic", "--max-stages", "1", "--out", str(t / "out"), "--site", site(t), "--job",
        job(t, JOB + "virtual_stages: [2]\n")], 1,
         ("job.yaml", "virtual_stages", "leave out 1", "at least 2 pipeline stages")),
]


@pytest.mark.parametrize("case", NARROWING_CASES, ids=[c.id for c in NARROWING_CASES])
def test_narrowing_hostile_input(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    test_hostile_input_or_fault(case, tmp_path, capsys, monkeypatch)


# ---------------------------------------------------------------- plan --resume: the folder reaches a shell


RESUME_CASES = [
    # the check render --resume had, now in planner.resume_job: refused before the checkpoint
    # is read or anything is planned
    Case("plan-resume-shell-unsafe", lambda t: ["plan", "--site", site(t), "--job", job(t), "--no-profile",
                                                "--out", str(t / "plans"), "--resume",
                                                str((t / "ck$(touch x)").mkdir() or t / "ck$(touch x)")],
         1, ("--resume", "not a plain path"),
         check=lambda t: (not (t / "x").exists() and not (t / "plans").exists()) or pytest.fail("ran")),
]


@pytest.mark.parametrize("case", RESUME_CASES, ids=[c.id for c in RESUME_CASES])
def test_resume_hostile_input(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    test_hostile_input_or_fault(case, tmp_path, capsys, monkeypatch)


# ---------------------------------------------------------------- FP8 searched: the job's choice, a plan's fp8


def fp8_plan(tmp: Path, **fields) -> str:
    return plan(tmp, json.dumps({**PLAN, **fields}))


BF16_JOB = JOB.replace("precision: fp32", "precision: bf16")
FP8_SEARCH_CASES = [
    Case("job-fp8-two-formats", lambda t: V("job", job(t, BF16_JOB + "fp8: [hybrid, e4m3]\n")), 1,
         ("job.yaml", "fp8", "[none, hybrid]")),
    Case("job-fp8-none-alone", lambda t: V("job", job(t, BF16_JOB + "fp8: [none]\n")), 1, ("job.yaml", "fp8")),
    Case("job-fp8-shell-text", lambda t: V("job", job(t, BF16_JOB + "fp8: [none, \"a'; echo foo\"]\n")), 1,
         ("job.yaml", "fp8")),
    Case("job-fp8-search-word", lambda t: V("job", job(t, BF16_JOB + "fp8: search\n")), 1,
         ("job.yaml", "fp8", "[none, FORMAT]")),
    Case("job-fp8-searched-in-fp32", lambda t: V("job", job(t, JOB + "fp8: [none, hybrid]\n")), 1,
         ("job.yaml", "fp8", "precision")),
    Case("plan-fp8-shell-text", lambda t: ["render", "--site", site(t), "--job", job(t, BF16_JOB), "--no-test-only",
                                           "--plan", fp8_plan(t, fp8="hybrid; rm -rf /")], 1, ("plan.json", "fp8")),
    Case("plan-fp8-empty", lambda t: ["render", "--site", site(t), "--job", job(t, BF16_JOB), "--no-test-only",
                                      "--plan", fp8_plan(t, fp8="")], 1, ("plan.json", "fp8")),
    Case("plan-fp8-recipe-unknown", lambda t: ["render", "--site", site(t), "--job", job(t, BF16_JOB), "--no-test-only",
                                               "--plan", fp8_plan(t, fp8="hybrid", fp8_recipe="nvfp4")], 1,
         ("plan.json", "fp8_recipe")),
    Case("plan-fp8-on-a100", lambda t: ["render", "--site", site(t), "--job", job(t, BF16_JOB), "--no-test-only",
                                        "--plan", fp8_plan(t, fp8="hybrid")], 1, ("fp8", "A100-80")),
    Case("plan-fp8-with-fp32-job", lambda t: ["predict", "--site", site(t), "--job", job(t), "--analytic",
                                              "--plan", fp8_plan(t, fp8="hybrid")], 1, ("fp8", "precision")),
]


@pytest.mark.parametrize("case", FP8_SEARCH_CASES, ids=[c.id for c in FP8_SEARCH_CASES])
def test_fp8_search_hostile_input(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    test_hostile_input_or_fault(case, tmp_path, capsys, monkeypatch)


BUCKET_CASES = [
    Case("plan-bucket-zero", lambda t: ["predict", "--site", site(t), "--job", job(t), "--analytic", "--plan",
                                        fp8_plan(t, overlap_grad_reduce=True, ddp_bucket_size=0)], 1,
         ("plan.json", "ddp_bucket_size", ">= 1")),
    Case("plan-bucket-text", lambda t: ["render", "--site", site(t), "--job", job(t), "--no-test-only", "--plan",
                                        fp8_plan(t, overlap_grad_reduce=True, ddp_bucket_size="40M; id")], 1,
         ("plan.json", "ddp_bucket_size")),
    Case("plan-bucket-bool", lambda t: ["predict", "--site", site(t), "--job", job(t), "--analytic", "--plan",
                                        fp8_plan(t, overlap_grad_reduce=True, ddp_bucket_size=True)], 1,
         ("plan.json", "ddp_bucket_size")),
    Case("plan-bucket-huge", lambda t: ["predict", "--site", site(t), "--job", job(t), "--analytic", "--plan",
                                        fp8_plan(t, overlap_grad_reduce=True, ddp_bucket_size=10**30)], 1,
         ("plan.json", "ddp_bucket_size")),
    Case("plan-bucket-without-overlap", lambda t: ["predict", "--site", site(t), "--job", job(t), "--analytic",
                                                   "--plan", fp8_plan(t, ddp_bucket_size=40_000_000)], 1,
         ("plan.json", "ddp_bucket_size", "--overlap-grad-reduce")),
]


@pytest.mark.parametrize("case", BUCKET_CASES, ids=[c.id for c in BUCKET_CASES])
def test_ddp_bucket_size_hostile_input(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture,
                                       monkeypatch) -> None:
    test_hostile_input_or_fault(case, tmp_path, capsys, monkeypatch)
