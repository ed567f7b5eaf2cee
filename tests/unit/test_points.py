"""Which points get profiled: the full grid, the minimal set's rule, and what is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from memx_hpc.profile.points import (estimate_seconds, full_grid, grid_axes, layer_points, minimal_set,
                                     missing_points)
from memx_hpc.profile.store import ProfileStore
from memx_hpc.spec import LayerSample, load_job, load_site, site_from_mapping

REPO = Path(__file__).resolve().parents[2]
LOCAL = REPO / "site_configs" / "local.yaml"
CROSS = REPO / "site_configs" / "example-cross-vendor.yaml"


def _load(site: Path, job: str):
    return load_site(site), load_job(REPO / "jobs" / job)


def test_axes_follow_site_and_job():
    site, job = _load(CROSS, "gpt3-2.7b.yaml")
    axes = {a.gpu_type: a for a in grid_axes(site, job)}
    assert axes["A100-80"].tps == (1, 2, 4)  # 4 per node, 32 heads
    assert axes["MI250X-GCD"].tps == (1, 2, 4, 8)  # 8 GCDs per node
    assert axes["A100-80"].multi_node and not axes["V100-32"].multi_node
    assert axes["V100-32"].micro_batch_sizes == (1, 2, 4, 8)
    assert axes["V100-32"].recompute_modes == ("none", "selective", "full")
    # TP must divide the query groups too (Llama-2-7B: 32 heads, 32 groups -> same here)
    site2, job2 = _load(CROSS, "llama2-7b.yaml")
    assert grid_axes(site2, job2)[1].tps == (1, 2, 4, 8)


@pytest.mark.parametrize("site_file,job_file", [(LOCAL, "tiny-gpt.yaml"), (CROSS, "gpt3-2.7b.yaml"),
                                                (CROSS, "llama2-7b.yaml")])
def test_minimal_set_is_a_small_subset_with_corners(site_file, job_file):
    site, job = _load(site_file, job_file)
    full, mini = full_grid(site, job), minimal_set(site, job)
    assert len(set(full)) == len(full) and len(set(mini)) == len(mini)
    assert set(mini) <= set(full)
    for ax in grid_axes(site, job):
        fl = [p for p in layer_points(full) if p.gpu_type == ax.gpu_type]
        ml = [p for p in layer_points(mini) if p.gpu_type == ax.gpu_type]
        assert len(fl) == ax.layer_grid_size
        # the corners of the micro-batch line and the largest TP are always there
        keys = {(p.tp, p.micro_batch_size, p.recompute) for p in ml}
        t0, t1 = ax.tps[0], ax.tps[-1]
        b0, b1 = ax.micro_batch_sizes[0], ax.micro_batch_sizes[-1]
        assert {(t0, b0, "none"), (t0, b1, "none"), (t1, b1, "none")} <= keys
        assert {r for _, _, r in keys} == set(ax.recompute_modes)  # every recompute mode calibrated
        assert len(ml) <= 6
        assert len(ml) <= len(fl) / 3
    # every GPU type has its optimizer, embedding, head and TP collectives
    for ax in grid_axes(site, job):
        kinds = {p.kind for p in mini if p.gpu_type == ax.gpu_type}
        assert {"layer", "embedding", "head", "optimizer", "allreduce", "p2p"} <= kinds


def test_minimal_share_shrinks_as_the_grid_grows():
    """The minimal set has a fixed size per GPU type, so its share falls with the grid:
    at or under 10 % once the layer grid has 60 points (e.g. 8 GPUs per node and the
    default micro-batch candidates)."""
    base = {"name": "big", "slurm": {"scheduler": "local"},
            "partitions": [{"name": "p", "gpu_type": "MI250X-GCD", "nodes": 1, "gpus_per_node": 8}]}
    site = site_from_mapping(base)
    _, job = _load(CROSS, "gpt3-2.7b.yaml")
    import dataclasses

    job_all_mbs = dataclasses.replace(job, micro_batch_sizes=())  # divisors of 64 up to 16: 5 sizes
    for j, bound in ((job, 0.125), (job_all_mbs, 0.10)):
        ax = grid_axes(site, j)[0]
        share = len(layer_points(minimal_set(site, j))) / len(layer_points(full_grid(site, j)))
        assert share <= bound, (ax.layer_grid_size, share)


def test_missing_points_skips_stored_ones(tmp_path):
    site, job = _load(LOCAL, "tiny-gpt.yaml")
    store = ProfileStore(tmp_path / "s.h5")
    mini = minimal_set(site, job)
    assert missing_points(site, job, store) == mini  # empty store: everything
    have = mini[:3]
    store.append([LayerSample(point=p, forward_ms=1.0) for p in have])
    store.append([LayerSample(point=mini[3], infeasible=True)])  # known not to fit: done too
    store.append([LayerSample(point=mini[4], forward_ms=2.0, origin="augmented")])  # an estimate: not done
    rest = missing_points(site, job, store)
    assert rest == mini[4:]


def test_estimates_are_positive_and_ordered():
    site, job = _load(CROSS, "gpt3-2.7b.yaml")
    pts = {(p.gpu_type, p.kind, p.tp, p.micro_batch_size, p.recompute): p for p in layer_points(full_grid(site, job))}
    small = estimate_seconds(site, pts[("V100-32", "layer", 1, 1, "none")])
    big = estimate_seconds(site, pts[("V100-32", "layer", 1, 8, "none")])
    fast = estimate_seconds(site, pts[("A100-80", "layer", 1, 8, "none")])
    assert 0 < small < big and fast < big  # more work costs more; a faster GPU costs less
    assert all(estimate_seconds(site, p) > 0 for p in full_grid(site, job))


def test_moe_points_cover_the_moe_layer_at_ep_and_the_alltoall():
    """Mixtral on the cross-vendor site: its layer points are MoE layers; on a node of 2+
    devices the MoE layer also runs at the smallest EP above 1 and the all-to-all over the
    smallest and largest EP groups for two micro-batch sizes; a model whose first layer is
    dense (moe_layer_freq) gets layer points of both kinds."""
    import dataclasses

    from memx_hpc.profile.runner import world_size_of

    site, job = _load(CROSS, "mixtral-8x7b.yaml")
    mini = minimal_set(site, job)
    layers = layer_points(mini)
    assert layers and all(p.shape.is_moe for p in layers)
    a100 = [p for p in mini if p.gpu_type == "A100-80"]
    ep_layers = [p for p in a100 if p.kind == "layer" and p.ep > 1]
    assert [p.ep for p in ep_layers] == [2] and world_size_of(ep_layers[0]) == 2
    a2a = [p for p in a100 if p.kind == "alltoall"]
    assert sorted({p.group_size for p in a2a}) == [2, 4]  # 4 A100s a node; 8 experts
    m = job.model
    p = next(x for x in a2a if x.group_size == 4)
    assert p.message_bytes == p.micro_batch_size * m.moe_router_topk * m.seq_length * m.hidden_size * 2 * 3 // 4
    assert set(minimal_set(site, job)) <= set(full_grid(site, job))
    mixed = dataclasses.replace(job, model=dataclasses.replace(m, moe_layer_freq=(0,) + (1,) * (m.num_layers - 1)))
    kinds = {q.shape.is_moe for q in layer_points(minimal_set(site, mixed)) if q.ep == 1}
    assert kinds == {False, True}
