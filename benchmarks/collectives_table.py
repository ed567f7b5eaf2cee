"""Predicted all-reduce bus bandwidth against message size, beside published nccl-tests results.

The check that memx_hpc.model.collectives has the published shape: latency-bound small messages,
a rise over one to three decades of size, saturation at a fraction of the line rate, and a
saturation size that grows with the number of nodes. Nothing is fitted to these figures.

1. One node of 8 H100 (NVLink 450 GB/s per direction), all_reduce busbw in GB/s.
   Published: Azure ND H200 v5 (8 x H200, the same NVLink 4 and NVSwitch), nccl-tests AllReduce
   in-place, NCCL 2.20.5, "Azure ND H200 v5 Benchmark Results", Azure/AI-benchmarking-guide,
   Azure_Results/ND_H200_v5_results.md (Microsoft). That run uses NVLink SHARP (NVLS), which
   reduces in the switch and so peaks at ~480 GB/s, above the line rate; the ring the model
   prices peaks at 365-370 GB/s on 2-8 H100 (NVIDIA/nccl issue 1455; S. Jeaugey, NVIDIA/nccl-tests
   issue 212: "with NCCL_ALGO=RING ... 370GB/s").
2. 2-16 nodes of 8 H100 over 400 Gb/s per GPU (AWS p5.48xlarge: 32 x 100 Gb/s EFA a node),
   all_reduce busbw in GB/s. Published: nccl-tests all_reduce_perf on p5.48xlarge (SageMaker
   HyperPod), crazyguitar/aws-gpu-communication-benchmark, data/nccl_all_reduce.csv (in-place
   busbw). The 2-node figures above 400 GB/s are NCCL's (NVLS) tree, whose bus bandwidth can exceed
   the network's on two nodes (S. Jeaugey, NVIDIA/nccl-tests issue 196); the model does not price
   that case.

What it shows (model / published): one node, 0.77-0.90 from 16 MiB up (the ring's 370 GB/s
against NVLS's 480) and ~0.55 below 1 MiB (the model prices the Simple protocol only; NCCL's
LL/LL128 protocols and NVLS have lower latency). 4-16 nodes at 4-8 GiB: 0.97-1.07, the peak
fraction holds. 8-16 nodes at 32-128 MiB: 1.6-2.0, and 1.1-1.8 from 256 MiB to 2 GiB: too
optimistic, the EFA run's latency is about twice NCCL's network figure, which the model takes for
every fabric. Gradient buckets (40 M parameters: 80-160 MB) sit in that range, so on EFA the
bucketed sync is priced low.

Run from the repository root:  .venv/bin/python benchmarks/collectives_table.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from memx_hpc.model import collectives as c  # noqa: E402
from memx_hpc.tables import table  # noqa: E402

MiB = 2**20

#: Azure ND H200 v5, AllReduce (NVLS) in-place busbw GB/s by message size (bytes, as the page's
#: "1K .. 8G" rows: powers of two)
ND_H200_V5 = {2**10: 0.06, 2**12: 0.23, 2**14: 0.93, 2**16: 3.72, 2**18: 14.75, 2**20: 52.96, 2**22: 138.44,
              2**24: 240.41, 2**26: 368.11, 2**28: 432.24, 2**30: 467.58, 2**32: 477.41, 2**33: 479.98}

#: p5.48xlarge, all_reduce_perf in-place busbw GB/s: nodes -> {size MiB: busbw}
P5_EFA = {
    2: {32: 147.22, 64: 225.95, 128: 300.29, 256: 365.84, 512: 396.78, 1024: 436.04, 2048: 444.64, 4096: 465.55,
        8192: 477.68},
    4: {32: 100.19, 64: 152.63, 128: 229.85, 256: 274.12, 512: 278.68, 1024: 280.27, 2048: 347.56, 4096: 354.24,
        8192: 357.08},
    8: {32: 89.62, 64: 102.49, 128: 154.33, 256: 234.18, 512: 271.56, 1024: 273.66, 2048: 279.59, 4096: 351.73,
        8192: 353.65},
    16: {32: 77.75, 64: 96.10, 128: 128.73, 256: 148.34, 512: 230.42, 1024: 267.99, 2048: 274.40, 4096: 311.65,
         8192: 353.92},
}


def one_node() -> None:
    shape = c.group_shape(ranks=8, gpus_per_node=8, intra_gbytes_per_s=450.0)
    sizes = sorted(ND_H200_V5)
    pred = c.busbw_gbytes_per_s(np.asarray(sizes, dtype=float), shape)
    rows = [[_size(s), f"{p:.1f}", f"{ND_H200_V5[s]:.2f}", f"{p / ND_H200_V5[s]:.2f}"] for s, p in zip(sizes, pred)]
    print("1. all-reduce on 8 x H100 in one node (NVLink 450 GB/s per direction)")
    print(f"   model: ring/tree, peak {c.peak_busbw_gbytes_per_s(shape):.0f} GB/s, latency "
          f"{c.ring_latency_us(shape):.0f} us, half-saturation {c.half_saturation_bytes(shape) / MiB:.1f} MiB")
    table(rows, ["size", "model GB/s", "ND H200 v5 NVLS GB/s", "model / published"])
    print()


def nodes() -> None:
    share = c.fabric_share_gbytes_per_s(100.0, gpus_per_node=8, adapters_per_node=32)  # p5: 32 x 100 Gb/s EFA
    print(f"2. all-reduce over 2-16 nodes of 8 x H100, {share:.0f} GB/s of EFA per GPU (p5.48xlarge)")
    sizes = [32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
    rows = []
    for m, published in P5_EFA.items():
        shape = c.group_shape(ranks=8 * m, gpus_per_node=8, intra_gbytes_per_s=450.0, inter_gbytes_per_s=share,
                              inter_link="efa")
        pred = c.busbw_gbytes_per_s(np.asarray(sizes, dtype=float) * MiB, shape)
        for s, p in zip(sizes, pred):
            rows.append([m, f"{s} MiB", f"{p:.1f}", f"{published[s]:.1f}", f"{p / published[s]:.2f}"])
        print(f"   {m:2d} nodes: peak {c.peak_busbw_gbytes_per_s(shape):.0f} GB/s, ring latency "
              f"{c.ring_latency_us(shape):.0f} us, tree latency {c.tree_latency_us(shape):.0f} us, ring "
              f"half-saturation {c.half_saturation_bytes(shape) / MiB:.0f} MiB")
    table(rows, ["nodes", "size", "model GB/s", "p5 EFA GB/s", "model / published"])
    print()


def ib_nodes() -> None:
    print("3. the same over 400 Gb/s InfiniBand NDR per GPU (one ConnectX-7 per GPU): model only")
    sizes = np.asarray([2**k for k in range(20, 34, 2)], dtype=float)
    rows = []
    for m in (1, 2, 4, 8, 16):
        shape = c.group_shape(ranks=8 * m, gpus_per_node=8, intra_gbytes_per_s=450.0, inter_gbytes_per_s=50.0,
                              inter_link="ib")
        rows.append([m] + [f"{b:.0f}" for b in c.busbw_gbytes_per_s(sizes, shape)])
    table(rows, ["nodes"] + [_size(int(s)) for s in sizes])


def _size(b: int) -> str:
    for unit, k in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 2**k:
            return f"{b / 2**k:g}{unit}"
    return f"{b}"


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    one_node()
    nodes()
    ib_nodes()


if __name__ == "__main__":
    main()
