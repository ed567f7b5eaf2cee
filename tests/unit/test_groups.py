"""Process groups with context and expert parallelism against megatron-core's own rank
generators, and the cross-vendor rule for the hot groups they add."""

from __future__ import annotations

import pytest

from memx_hpc.slurm.groups import KINDS, _groups, cross_vendor_unsupported, group_backends, kinds


def _megatron(tp, cp, dp, pp, ep, etp):
    ps = pytest.importorskip("megatron.core.parallel_state")
    dense = ps.RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order="tp-cp-ep-dp-pp")
    edp = tp * cp * dp // (etp * ep)
    expert = ps.RankGenerator(tp=etp, ep=ep, dp=edp, pp=pp, cp=1, order="tp-cp-ep-dp-pp")
    return dense, expert


@pytest.mark.parametrize("tp,cp,dp,pp,ep,etp", [(2, 2, 2, 2, 2, 1), (2, 1, 4, 2, 4, 2), (1, 4, 2, 1, 2, 1),
                                                (4, 2, 1, 2, 8, 1)])
def test_groups_are_megatron_cores(tp, cp, dp, pp, ep, etp):
    dense, expert = _megatron(tp, cp, dp, pp, ep, etp)
    same = lambda ours, theirs: sorted(tuple(g) for g in ours) == sorted(tuple(g) for g in theirs)  # noqa: E731
    for kind, token in (("tp", "tp"), ("cp", "cp"), ("dp", "dp"), ("dp_cp", "dp-cp"), ("pp", "pp"), ("mp", "tp-pp")):
        assert same(_groups(kind, tp, dp, pp, cp, ep, etp), dense.get_ranks(token)), kind
    for kind, token in (("ep", "ep"), ("etp", "tp"), ("edp", "dp")):
        assert same(_groups(kind, tp, dp, pp, cp, ep, etp), expert.get_ranks(token)), kind


def test_a_dense_job_keeps_its_groups():
    assert kinds() == KINDS
    vendors = ["nvidia"] * 4 + ["amd"] * 4
    assert [g.kind for g in group_backends(vendors, tp=2, dp=2, pp=2)] == \
        [k for k in KINDS for _ in _groups(k, 2, 2, 2)]


def test_cross_vendor_ep_and_cp_groups_get_ucc_and_gloo_is_refused_for_reduce_scatter():
    # ranks 0-3 NVIDIA, 4-7 AMD in one stage: an EP group of 8 spans both vendors
    vendors = ["nvidia"] * 4 + ["amd"] * 4
    groups = group_backends(vendors, tp=1, dp=4, pp=1, cp=2, ep=8, etp=1)
    ep = [g for g in groups if g.kind == "ep"]
    assert len(ep) == 1 and ep[0].cross_vendor and ep[0].backend == "ucc"
    assert any(g.kind == "dp_cp" and g.cross_vendor for g in groups)
    assert cross_vendor_unsupported(groups) == []
    on_gloo = group_backends(vendors, tp=1, dp=4, pp=1, cp=2, ep=8, etp=1, cross_vendor_backend="gloo")
    why = cross_vendor_unsupported(on_gloo)
    assert why and all("reduce_scatter" in w for w in why)
    assert any(w.startswith("dp_cp") for w in why)
    # EP inside one vendor: nothing crosses but the data-parallel gradient groups
    inside = group_backends(vendors, tp=1, dp=8, pp=1, ep=4)
    assert all(not g.cross_vendor for g in inside if g.kind == "ep")
