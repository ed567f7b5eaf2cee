"""What fraction of a GPU type's dense matrix rate the transfer model gives one Megatron layer.

The transfer model (memx_hpc.model.anchors.Anchors.datasheet) prices a GPU type the store
never profiled from the roofline's own parts at costs fitted on every measured chip. This
prints, for one Llama-3-8B layer (bf16, sequence 8192, micro-batch 1, sdpa attention, no
recompute) at TP 1 and TP 8, the predicted layer time and the share of it the datasheet
matrix rate accounts for (roofline compute time / predicted time), for the catalog's
types, with the fitted costs. The fit is on the full shipped store (Sailor's and Cephalo's
profiles), as `memx-hpc plan` fits it; nothing here is scored against measurements (for
that: benchmarks/public_runs.py, benchmarks/ranking.py, benchmarks/accuracy.py).

Run from the repository root:  .venv/bin/python benchmarks/transfer_fractions.py
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from memx_hpc.spec.catalog import catalog  # noqa: E402
from memx_hpc.model.api import LayerQuery, roofline_components  # noqa: E402
from memx_hpc.spec import LayerShape  # noqa: E402
from memx_hpc.tables import table  # noqa: E402

TYPES = ("A100-80", "H100-SXM", "B200", "GB200", "MI250X-GCD", "MI300X", "H100-NVL", "L4")


def llama3_8b_layer(gpu_type: str, tp: int, kernels: str = "megatron") -> LayerQuery:
    shape = LayerShape(hidden_size=4096, num_attention_heads=32, num_query_groups=8, ffn_hidden_size=14336,
                       seq_length=8192, vocab_size=128256, activation="swiglu")
    return LayerQuery(gpu_type=gpu_type, kind="layer", shape=shape, tp=tp, micro_batch_size=1, recompute="none",
                      precision="bf16", attention="sdpa", sequence_parallel=tp > 1, kernels=kernels)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.parse_args(argv)
    from ranking import fit_without, store_samples

    from memx_hpc.datapaths import shared_data
    cat = catalog()
    anchors = fit_without(store_samples(shared_data()), None).anchors_.bind(cat)
    coef, fpw_median, fpw_module = anchors._parts_fit("layer", "half", "sdpa")
    names = ("a0 compute", "a1 compute x F", "b megatron", "b eager", "c TP", "d ms")
    print("parts fit (layer, 16-bit, sdpa): " + ", ".join(f"{n} {v:.3g}" for n, v in zip(names, coef))
          + f"; median F {fpw_median:.3g}, module F bound {fpw_module:.3g}")
    rows = []
    for name in TYPES:
        g = cat.get(name)
        for tp in (1, 8):
            out = [name, g.form_factor or "card", tp]
            for kernels in ("megatron", "eager"):
                q = llama3_8b_layer(name, tp, kernels)
                c = roofline_components(q, g)
                t = math.exp(anchors.datasheet(q, g)) * (c["compute_ms"] + c["memory_ms"] + c["comm_ms"])
                out += [f"{t:.2f}", f"{c['compute_ms'] / t:.0%}"]
            rows.append(out)
    table(rows, ["gpu", "form", "tp", "megatron ms", "of matrix rate", "eager ms", "of matrix rate"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
