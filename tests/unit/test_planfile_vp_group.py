"""The plan's micro-batch group per virtual stage: validated as megatron-core's interleaved
schedule does, written and read by the plan file, priced in the in-flight activations."""

import pytest

from memx_hpc.errors import SpecError
from memx_hpc.model.schedule import in_flight_chunks
from memx_hpc.model.stage_memory import in_flight_heads, in_flight_units
from memx_hpc.planfile import plan_from_mapping, plan_to_dict
from memx_hpc.spec import Plan, Stage


def _plan(gbs: int, group=None, v: int = 3, pp: int = 4) -> Plan:
    return Plan(tp=1, dp=2, micro_batch_size=4, global_batch_size=gbs, virtual_stages=v,
                microbatch_group_size_per_vp_stage=group, stages=(Stage(partition="p", num_layers=3),) * pp)


def test_a_group_admits_what_the_default_refuses():
    # Megatron-LM CI's gpt3_mcore_te_tp1_pp4_vp1_tunable_overlap: 5 micro-batches, pp 4, group 5
    with pytest.raises(SpecError) as e:
        _plan(40)
    assert e.value.field == "virtual_stages"
    plan = _plan(40, 5)
    assert plan.vp_group == 5 and plan.num_microbatches == 5


@pytest.mark.parametrize("gbs,group", [(40, 3), (40, 6), (64, 6)])
def test_megatron_core_group_rules(gbs, group):
    """p <= G <= m, and the last group empty or at least p (schedules.py)."""
    with pytest.raises(SpecError) as e:
        _plan(gbs, group)
    assert e.value.field == "microbatch_group_size_per_vp_stage"


def test_a_group_needs_interleaving():
    with pytest.raises(SpecError) as e:
        Plan(tp=1, dp=2, micro_batch_size=4, global_batch_size=64, microbatch_group_size_per_vp_stage=4,
             stages=(Stage(partition="p", num_layers=3),) * 4)
    assert e.value.field == "microbatch_group_size_per_vp_stage"


def test_the_plan_file_round_trips_the_group_and_omits_the_default():
    plan = _plan(40, 5)
    d = plan_to_dict(plan)
    assert d["microbatch_group_size_per_vp_stage"] == 5
    assert plan_from_mapping(d) == plan
    d = plan_to_dict(_plan(64))
    assert "microbatch_group_size_per_vp_stage" not in d
    assert plan_from_mapping(d).microbatch_group_size_per_vp_stage is None


def test_a_larger_group_holds_more_chunks_in_flight():
    """Megatron's warm-up 2(p - i - 1) + (v - 1) G: the first of 4 stages with 3 chunks and
    16 micro-batches holds 6 + 2 x 8 + 1 = 23 chunks with G = 8 against 15 with G = 4."""
    assert in_flight_chunks(0, 4, 16, 3, 8) == 23 and in_flight_chunks(0, 4, 16, 3) == 15
    assert in_flight_units(4, 0, 16, 3, 8) == pytest.approx(23 / 3)
    assert in_flight_units(4, 0, 16, 3, None) == in_flight_units(4, 0, 16, 3, 4) == pytest.approx(5.0)
    assert in_flight_heads(4, 3, 16, 3, 8) >= 1
