"""Small helpers to find and describe a reachable Slurm cluster.

Used by the tests that run against the real local cluster started by
``scripts/slurm-local.sh start``, but nothing here is specific to it: the
functions talk to whatever cluster the Slurm client commands on ``PATH`` reach
(``SLURM_CONF`` or ``/etc/slurm/slurm.conf``). Every call to a Slurm command has
a timeout, because a client whose controller is down retries for a long time.
Nothing runs at import time.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from typing import Any

from ..errors import SystemFailure
from .bounded import bounded_run

__all__ = [
    "slurm_available",
    "partitions",
    "parse_gres",
    "sacct_state",
    "wait_sacct_state",
    "START_HINT",
]

#: What to tell a developer whose tests cannot reach Slurm.
START_HINT = "start the local cluster with: scripts/slurm-local.sh start"

_SEP = "\x1f"  # unit separator: never appears in partition, node or GRES names


#: What a Slurm client here may print before it is stopped (an answer about a cluster is
#: kilobytes; the bound keeps a broken client from running the caller out of memory).
MAX_ANSWER_BYTES = 64 * 2**20


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str] | None:
    """Runs a Slurm client; None when it is missing, hangs, prints more than
    :data:`MAX_ANSWER_BYTES` or cannot start (these helpers only ask whether Slurm answers)."""
    try:
        rc, out, err = bounded_run(args, timeout, MAX_ANSWER_BYTES)
    except (OSError, SystemFailure):
        return None
    return subprocess.CompletedProcess(args, rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


def slurm_available(timeout: float = 5.0) -> bool:
    """True when ``sbatch`` is on PATH and ``sinfo`` answers within ``timeout`` s."""
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return False
    r = _run(["sinfo", "-h", "-o", "%P"], timeout)
    return r is not None and r.returncode == 0 and bool(r.stdout.strip())


def parse_gres(gres: str) -> list[str]:
    """Splits a GRES string from sinfo into items, dropping socket annotations.

    ``"gpu:a100:2(S:0-1),shard:8"`` -> ``["gpu:a100:2", "shard:8"]``;
    ``"(null)"`` and ``""`` -> ``[]``.
    """
    gres = gres.strip()
    if not gres or gres in ("(null)", "N/A"):
        return []
    # drop "(S:0,1)"-style annotations first, so commas inside them don't split
    gres = re.sub(r"\([^)]*\)", "", gres)
    return [g.strip() for g in gres.split(",") if g.strip()]


def _gpu_counts(gres_items: list[str]) -> dict[str, int]:
    """``["gpu:a100:2", "gpu:1"]`` -> ``{"a100": 2, "": 1}`` (``""``: untyped)."""
    out: dict[str, int] = {}
    for item in gres_items:
        parts = item.split(":")
        if parts[0] != "gpu":
            continue
        if len(parts) == 3:
            gtype, count = parts[1], parts[2]
        elif len(parts) == 2:
            gtype, count = ("", parts[1]) if parts[1].isdigit() else (parts[1], "1")
        else:
            gtype, count = "", "1"
        try:
            n = int(count)
        except ValueError:
            continue
        out[gtype] = out.get(gtype, 0) + n
    return out


def partitions(timeout: float = 10.0) -> dict[str, dict[str, Any]]:
    """Describes every partition that ``sinfo`` shows.

    Returns ``{name: {"name", "default", "available", "nodes", "gres", "gpus"}}``
    where ``nodes`` is the sorted list of node names, ``gres`` the sorted list of
    distinct GRES items on those nodes (e.g. ``["gpu:a100:2"]``), and ``gpus`` maps
    GPU type to the total count in the partition (``""`` for untyped GPUs).

    Raises ``RuntimeError`` when ``sinfo`` is missing, fails or times out.
    """
    fmt = _SEP.join(["%P", "%N", "%G", "%a"])
    r = _run(["sinfo", "-h", "-N", "-o", fmt], timeout)
    if r is None:
        raise RuntimeError(f"sinfo is missing or did not answer within {timeout} s")
    if r.returncode != 0:
        raise RuntimeError(f"sinfo failed (exit {r.returncode}): {r.stderr.strip()}")
    parts: dict[str, dict[str, Any]] = {}
    node_gres: dict[str, dict[str, list[str]]] = {}
    for line in r.stdout.splitlines():
        fields = line.split(_SEP)
        if len(fields) != 4:
            continue
        pname, node, gres, avail = (f.strip() for f in fields)
        default = pname.endswith("*")
        pname = pname.rstrip("*")
        p = parts.setdefault(
            pname,
            {"name": pname, "default": default, "available": avail, "nodes": []},
        )
        p["default"] = p["default"] or default
        if node not in p["nodes"]:
            p["nodes"].append(node)
        node_gres.setdefault(pname, {})[node] = parse_gres(gres)
    for pname, p in parts.items():
        p["nodes"].sort()
        items = [g for n in p["nodes"] for g in node_gres[pname][n]]
        p["gres"] = sorted(set(items))
        p["gpus"] = _gpu_counts(items)
    return parts


def sacct_state(job_id: str | int, timeout: float = 10.0) -> str | None:
    """State of a job's allocation in accounting (e.g. ``"COMPLETED"``).

    None when sacct does not (yet) know the job, fails or times out. Slurm
    records a job in the database a moment after it ends, so poll with
    :func:`wait_sacct_state`.
    """
    r = _run(["sacct", "-n", "-P", "-X", "-j", str(job_id), "-o", "JobID,State"], timeout)
    if r is None or r.returncode != 0:
        return None
    for line in r.stdout.splitlines():
        jid, _, state = line.partition("|")
        if jid.strip() == str(job_id):
            # "CANCELLED by 0" -> "CANCELLED"
            return state.split()[0] if state.strip() else None
    return None


def wait_sacct_state(
    job_id: str | int,
    states: tuple[str, ...] = ("COMPLETED",),
    timeout: float = 30.0,
    poll: float = 0.5,
) -> str | None:
    """Polls sacct until the job reaches one of ``states`` or a final state.

    Returns the last state seen (None if sacct never reported the job).
    """
    final = {
        "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY",
        "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "PREEMPTED",
    }
    deadline = time.monotonic() + timeout
    state: str | None = None
    while True:
        state = sacct_state(job_id)
        if state is not None and (state in states or state in final):
            return state
        if time.monotonic() >= deadline:
            return state
        time.sleep(poll)
