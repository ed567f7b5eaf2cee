"""Which model answers which GPU type when plan/search load their cost model from a store."""

from __future__ import annotations

from pathlib import Path

import pytest

from memx_hpc.planner import MIN_TYPES_FOR_DATASHEET_TRANSFER, load_cost_model
from memx_hpc.datapaths import sailor_dir
from memx_hpc.model.api import AnalyticCostModel
from memx_hpc.model.predictor import Predictor
from memx_hpc.profile.importers import import_sailor
from memx_hpc.profile.store import ProfileStore
from memx_hpc.spec import load_job, load_site

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sailor_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("route") / "store.h5"
    ProfileStore(path).append(import_sailor(sailor_dir()))
    return path


def test_unprofiled_gpu_types_use_the_datasheet_booster_when_the_store_spans_types(sailor_store):
    site = load_site(ROOT / "site_configs/example-cross-vendor.yaml")  # A100-80 profiled; MI250X, V100-32 not
    job = load_job(ROOT / "jobs/gpt3-2.7b.yaml")
    types = {s.point.gpu_type for s in ProfileStore(sailor_store).samples(kind="layer")}
    assert len(types) >= MIN_TYPES_FOR_DATASHEET_TRANSFER
    notes: list[str] = []
    model = load_cost_model(site, job, sailor_store, analytic=False, notes=notes)
    assert isinstance(model.layers.model_for("MI250X-GCD"), Predictor)
    assert isinstance(model.layers.model_for("A100-80"), Predictor)
    assert model.provenance("MI250X-GCD") == "datasheet-only"
    assert model.provenance("A100-80") in ("imported", "augmented")
    assert any("datasheet figures and the" in n for n in notes)


def test_a_store_of_one_gpu_type_leaves_the_others_to_the_roofline(tmp_path, sailor_store):
    only = [s for s in ProfileStore(sailor_store).samples() if s.point.gpu_type == "A100-80"]
    path = tmp_path / "one.h5"
    ProfileStore(path).append(only)
    site = load_site(ROOT / "site_configs/example-cross-vendor.yaml")
    job = load_job(ROOT / "jobs/gpt3-2.7b.yaml")
    notes: list[str] = []
    model = load_cost_model(site, job, path, analytic=False, notes=notes)
    assert isinstance(model.layers.model_for("A100-80"), Predictor)
    assert isinstance(model.layers.model_for("MI250X-GCD"), AnalyticCostModel)
    assert any("datasheet roofline" in n for n in notes)


def test_same_chip_and_alias_names_use_the_imported_layer_times(tmp_path, sailor_store):
    """V100-32 (no samples) takes V100-16's imported layer times (one chip in gpus.yaml);
    a partition that names Sailor's ``GH-96`` gets the GH200 samples, not the datasheet."""
    import dataclasses
    only = [s for s in ProfileStore(sailor_store).samples() if s.point.gpu_type in ("V100-16", "GH200")]
    path = tmp_path / "two.h5"
    ProfileStore(path).append(only)
    site = load_site(ROOT / "site_configs/example-cross-vendor.yaml")
    parts = tuple(dataclasses.replace(p, gpu_type="GH-96") if p.gpu_type == "A100-80" else p
                  for p in site.partitions)
    site = dataclasses.replace(site, partitions=parts)
    job = load_job(ROOT / "jobs/gpt3-2.7b.yaml")
    notes: list[str] = []
    model = load_cost_model(site, job, path, analytic=False, notes=notes)
    assert isinstance(model.layers.model_for("V100-32"), Predictor)
    assert model.provenance("V100-32") == "imported (same chip as V100-16)"
    for name in ("GH-96", "GH200"):
        assert isinstance(model.layers.model_for(name), Predictor)
        assert model.provenance(name) == "imported"
    assert isinstance(model.layers.model_for("MI250X-GCD"), AnalyticCostModel)  # two types: too few to transfer
    assert any("V100-32: no samples of its own; layer times from V100-16" in n for n in notes)


def test_a_job_shape_never_profiled_is_named_extrapolated(sailor_store):
    site = load_site(ROOT / "site_configs/example-cross-vendor.yaml")
    job = load_job(ROOT / "jobs/gpt3-2.7b.yaml")
    notes: list[str] = []
    load_cost_model(site, job, sailor_store, analytic=False, notes=notes)
    assert any("A100-80: " in n and "never profiled on this chip" in n and "extrapolated" in n for n in notes), notes


def test_a_site_of_only_unprofiled_types_gets_the_numbers_it_gets_beside_a_profiled_partition(sailor_store):
    """The transfer from the store's measured chips to a GPU type never profiled depends on the
    store, not on what else the site holds: MI250X-GCD alone, and MI250X-GCD beside an A100-80
    partition no plan below uses, get the same layer times, memory and plan predictions."""
    import dataclasses

    from memx_hpc.model.compose import layer_query, predict_plan
    from memx_hpc.spec import Plan, Recompute, Stage

    full = load_site(ROOT / "site_configs/example-cross-vendor.yaml")
    mi = next(p for p in full.partitions if p.gpu_type == "MI250X-GCD")
    a100 = next(p for p in full.partitions if p.gpu_type == "A100-80")
    alone = dataclasses.replace(full, partitions=(mi,))
    beside = dataclasses.replace(full, partitions=(mi, a100))
    job = load_job(ROOT / "jobs/gpt3-2.7b.yaml")
    queries = [layer_query(job, "MI250X-GCD", kind=k, tp=tp, micro_batch_size=b, recompute="none",
                           sequence_parallel=False)
               for k in ("layer", "embedding", "head") for tp in (1, 2, 8) for b in (1, 4)]
    plans = [Plan(tp=tp, dp=8 // (tp * pp), micro_batch_size=b, global_batch_size=64,
                  stages=tuple(Stage(partition=mi.name, num_layers=job.model.num_layers // pp,
                                     recompute=Recompute(mode="full")) for _ in range(pp)))
             for tp, pp, b in ((1, 1, 1), (2, 2, 2), (8, 1, 4), (1, 4, 1))]
    answers = []
    for site in (alone, beside):
        notes: list[str] = []
        model = load_cost_model(site, job, sailor_store, analytic=False, notes=notes)
        assert isinstance(model.layers.model_for("MI250X-GCD"), Predictor), notes
        assert model.provenance("MI250X-GCD") == "datasheet-only"
        assert any("MI250X-GCD" in n and "datasheet figures and the" in n for n in notes), notes
        pred = model.predict(queries)
        runs = [predict_plan(p, site, job, model) for p in plans]
        answers.append((pred, [(r.iteration_ms, [st.peak_bytes for st in r.stages]) for r in runs]))
    (p0, r0), (p1, r1) = answers
    assert (p0 == p1).all()
    assert r0 == r1
    # and these are the transfer model's numbers, not the roofline's (which is never slower)
    roof = AnalyticCostModel(alone).predict(queries)
    layer = [i for i, q in enumerate(queries) if q.kind == "layer"]
    assert (p0[layer, 0] > roof[layer, 0]).all()


def test_a_type_known_only_from_eager_layers_is_named(tmp_path):
    """Cephalo times Hugging Face layers in plain PyTorch; a plan runs Megatron's fused ones.
    A site type whose layer samples of the job's attention are all Cephalo's says so; the same
    type measured by Megatron-DeepSpeed (Sailor's profiles) does not."""
    import dataclasses

    from memx_hpc.datapaths import shared_data
    from memx_hpc.planner import eager_layer_notes
    from memx_hpc.profile.importers import import_cephalo
    site = load_site(ROOT / "site_configs/example-cross-vendor.yaml")  # A100-80 among its types
    job = load_job(ROOT / "jobs/llama2-7b.yaml")
    cephalo = [s for s in import_cephalo(shared_data() / "cephalo" / "model_latencies.json")
               if s.point.gpu_type == "A100-80"]
    assert cephalo and {s.point.attention for s in cephalo} == {job.attention}
    notes = eager_layer_notes(site, job, cephalo, ["A100-80"])
    assert len(notes) == 1 and notes[0].startswith("A100-80: ") and "plain-PyTorch" in notes[0], notes
    megatron = [dataclasses.replace(s, source="slurm:1234") for s in cephalo]
    assert eager_layer_notes(site, job, megatron, ["A100-80"]) == []
    assert eager_layer_notes(site, job, cephalo + megatron, ["A100-80"]) == []
    # through the planner's own loading: the shipped store's A100 sdpa layers are Cephalo's
    path = tmp_path / "c.h5"
    ProfileStore(path).append(cephalo + import_sailor(sailor_dir()))
    out: list[str] = []
    load_cost_model(site, job, path, analytic=False, notes=out)
    assert any(n.startswith("A100-80: its layer times are plain-PyTorch") for n in out), out
