"""Preflight of one hetjob component, run by every rank before the training entry starts.

Self-contained (the standard library and torch only): the rendered script runs this file's
text with ``python -c`` in the partition's own Python, where memx-hpc need not be
installed (single-vendor plans launch Megatron-LM's ``pretrain_gpt.py``). It fails fast,
naming the partition, when

* the entry is missing (a script path that is not a file, a ``-m`` module not importable),
* torch does not import,
* the GPU is not the partition's vendor (a CUDA torch on an AMD partition, no GPU visible),
* torch lacks a backend one of the component's process groups needs
  (``torch.distributed.is_ucc_available()`` for groups that span vendors).

Usage: ``python preflight.py PARTITION VENDOR BACKENDS ENTRY...`` with BACKENDS a comma list
(``nccl,ucc,gloo``) and ENTRY the script path or ``-m module``. Exit 0, or 3 with one line
per problem on stderr.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any, Sequence

EXIT_PREFLIGHT = 3


def _vendor_problems(torch: Any, vendor: str) -> list[str]:
    if vendor == "cpu":
        return []
    hip = getattr(torch.version, "hip", None)
    cuda = getattr(torch.version, "cuda", None)
    if vendor == "nvidia" and (hip or not cuda):
        return [f"the partition has NVIDIA GPUs but this torch is built for {'ROCm ' + hip if hip else 'CPU only'}"]
    if vendor == "amd" and not hip:
        return [f"the partition has AMD GPUs but this torch is built for {'CUDA ' + cuda if cuda else 'CPU only'}"]
    if vendor in ("nvidia", "amd") and not torch.cuda.is_available():
        return [f"no {vendor.upper()} GPU is visible to this task (CUDA_VISIBLE_DEVICES/ROCR_VISIBLE_DEVICES, "
                f"--gres)"]
    return []


def _backend_problems(torch: Any, backends: Sequence[str]) -> list[str]:
    out = []
    for b in backends:
        probe = getattr(torch.distributed, f"is_{b}_available", None)
        if probe is None or not probe():
            out.append(f"torch.distributed has no {b} backend here (torch.distributed.is_{b}_available() is "
                       f"false), and this component's process groups need it")
    return out


def _entry_problems(entry: Sequence[str]) -> list[str]:
    if len(entry) == 2 and entry[0] == "-m":
        try:
            found = importlib.util.find_spec(entry[1]) is not None
        except (ImportError, ValueError):
            found = False
        return [] if found else [f"the training entry module {entry[1]} is not importable by this Python"]
    if len(entry) != 1:
        return [f"cannot read the entry {list(entry)}"]
    return [] if os.path.isfile(entry[0]) else [f"the training entry {entry[0]} is not a file (from {os.getcwd()})"]


def problems(vendor: str, backends: Sequence[str], entry: Sequence[str]) -> list[str]:
    found = _entry_problems(entry)
    try:
        import torch
        import torch.distributed
    except Exception as e:  # noqa: BLE001 - any import failure is the finding
        return found + [f"torch does not import: {type(e).__name__}: {e}"]
    return found + _vendor_problems(torch, vendor) + _backend_problems(torch, backends)


def main(argv: Sequence[str]) -> int:
    if len(argv) < 4:
        print("usage: preflight PARTITION VENDOR BACKENDS ENTRY...", file=sys.stderr)
        return 2
    partition, vendor, backends, entry = argv[0], argv[1], [b for b in argv[2].split(",") if b], argv[3:]
    found = problems(vendor, backends, entry)
    for p in found:
        print(f"memx-hpc preflight: partition {partition}: {p}", file=sys.stderr, flush=True)
    return EXIT_PREFLIGHT if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
