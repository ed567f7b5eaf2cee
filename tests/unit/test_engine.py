"""The search engine against brute force: top-K, time-only ranking, Pareto front, feasibility."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from memx_hpc.cli.main import main
from memx_hpc.errors import SystemFailure
from memx_hpc.search.cache import PredictionCache
from memx_hpc.model.compose import predict_plan
from memx_hpc.search.engine import SearchOptions, launched_under_mpi, mpi_comm, search
from memx_hpc.search.objective import TIME_ONLY, Weights, log_score
from memx_hpc.search.space import PlanSpace, SpaceOptions
from memx_hpc.spec import Link, ModelSpec, Partition, Site, job_for_model

GiB = 2**30


class LinearModel:
    """Explicit per-layer costs (see tests/unit/test_cost.py for the same model by hand)."""

    T = {"A100-80": 10.0, "V100-32": 25.0}
    MODE_T = {"none": 1.0, "selective": 1.25, "full": 4 / 3}
    MODE_A = {"none": 1.0, "selective": 0.8, "full": 0.1}

    def __init__(self, act: float = 1e9, tag: str = "") -> None:
        self.act = act
        self.identity = hashlib.sha256(f"linear-{act}-{tag}".encode()).hexdigest()
        self.rows = 0

    def predict(self, queries):
        self.rows += len(queries)
        out = np.zeros((len(queries), 2))
        for i, q in enumerate(queries):
            b = q.micro_batch_size
            if q.kind == "layer":
                out[i] = (self.T[q.gpu_type] * b / q.tp * self.MODE_T[q.recompute],
                          self.act * b / q.tp * self.MODE_A[q.recompute])
            else:
                out[i] = ((1.0 if q.kind == "embedding" else 5.0) * b, (1e6 if q.kind == "embedding" else 5e7) * b)
        return out

    def overhead_bytes(self, gpu_type):
        return GiB

    def provenance(self, gpu_type):
        return "measured"


def setup(margin=0.05):
    site = Site(name="two", memory_safety_margin=margin,
                partitions=(Partition(name="pA", gpu_type="A100-80", nodes=1, gpus_per_node=4),
                            Partition(name="pV", gpu_type="V100-32", nodes=1, gpus_per_node=4)),
                links=(Link(a="pA", b="pV", gbps=10.0),))
    m = ModelSpec(name="small", num_layers=5, hidden_size=1024, num_attention_heads=8, num_query_groups=8,
                  ffn_hidden_size=4096, vocab_size=1000, seq_length=512)
    job = job_for_model(m, 16)
    space = PlanSpace(site, job, SpaceOptions(layer_granularity=1, max_pipeline_stages=3, recompute_spread=None,
                                              tp_degrees=(1, 4), micro_batch_sizes=(1, 4)))
    return site, job, space


def brute(space, model, weights):
    rows = []
    for i, plan in space.iter_range(0, len(space)):
        p = predict_plan(plan, space.site, space.job, model)
        if p.feasible:
            rows.append((float(log_score(p.iteration_ms, p.max_utilisation, p.balance, weights)), i,
                         p.iteration_ms, p.max_utilisation))
    return rows


@pytest.fixture(scope="module")
def world():
    site, job, space = setup()
    model = LinearModel()
    w = Weights(time=1, memory=1, balance=0.5)
    return site, job, space, model, w, brute(space, model, w)


def test_top_k_time_ranking_and_pareto_equal_brute_force(world):
    site, job, space, model, w, rows = world
    assert 0 < len(rows) < len(space)
    r = search(space, model, options=SearchOptions(top_k=7, weights=w, block_size=333))

    def distinct(ordered):  # the first index of each distinct runnable plan
        seen, out = set(), []
        for x in ordered:
            plan = space.plan_at(x[1])
            if plan not in seen:
                seen.add(plan)
                out.append(x)
        return out

    want = distinct(sorted(rows, key=lambda x: (x[0], x[1])))[:7]
    assert [s.index for s in r.top] == [x[1] for x in want]
    assert [s.rank for s in r.top] == list(range(1, 8))
    assert [np.log(s.score) for s in r.top] == pytest.approx([x[0] for x in want])
    by_time = distinct(sorted(rows, key=lambda x: (x[2], x[1])))
    assert [s.index for s in r.time_top] == [x[1] for x in by_time[:7]]
    times = np.array([x[2] for x in rows])
    for s in r.top + r.time_top:
        # 1 + the number of strictly faster feasible plans (exact ties share a rank; the
        # scalar and vectorised paths may differ in the last bits, hence the band)
        t = s.prediction.iteration_ms
        assert 1 + int((times < t * (1 - 1e-9)).sum()) <= s.time_rank <= 1 + int((times < t * (1 + 1e-9)).sum())
        assert s.prediction.feasible
    front = set()
    for _, i, t, u in rows:
        if not any((t2 <= t and u2 <= u) and (t2 < t or u2 < u) for _, _, t2, u2 in rows):
            front.add((t, u))
    got = sorted((p.iteration_ms, p.max_utilisation) for p in r.pareto)
    assert len(got) == len(front) and np.allclose(got, sorted(front), rtol=1e-12)
    assert r.stats.plans == len(space) and r.stats.feasible == len(rows)


def brute_recommended(space, model, bands, noise):
    """The recommended plan by its definition, plan by plan with the scalar composition."""
    from memx_hpc.search.objective import risk_utilisation
    rows = []
    for i, plan in space.iter_range(0, len(space)):
        p = predict_plan(plan, space.site, space.job, model)
        r = risk_utilisation(p, bands)
        if p.feasible and r <= 1.0:
            rows.append((p.iteration_ms, (int(r * 100 + 1e-9), p.balance), i))
    t0 = min(t for t, _, _ in rows)
    band = [x for x in rows if x[0] <= t0 * (1 + noise) * (1 + 1e-12)]
    return min(band, key=lambda x: (x[1], x[0], x[2])), rows, t0


@pytest.mark.parametrize("bands", [{"A100-80": 0.0, "V100-32": 0.0}, {"A100-80": 0.15, "V100-32": 0.4}])
def test_recommended_plan_equals_its_definition(bands):
    site, job, space = setup(margin=0.05)
    model = LinearModel(act=2.5e9)
    noise = 0.05
    want, rows, t0 = brute_recommended(space, model, bands, noise)
    r = search(space, model, options=SearchOptions(top_k=5, memory_error=bands, time_noise=noise, block_size=97))
    rec = r.recommended
    assert rec is not None and rec.risk_feasible
    assert space.plan_at(rec.index) == space.plan_at(want[2])
    assert rec.prediction.iteration_ms <= t0 * (1 + noise) * (1 + 1e-9)
    assert r.risk_feasible == len(rows)
    # every plan of the recommended ranking is risk-feasible; the fastest feasible plan may not be
    assert all(s.risk_feasible for s in r.recommended_top)
    assert r.fastest.prediction.iteration_ms <= rec.prediction.iteration_ms
    assert r.fastest_safe.risk_feasible and r.fastest_safe.prediction.iteration_ms == pytest.approx(t0)
    assert r.ranking("memx") == r.top and r.ranking("recommended") == r.recommended_top


def test_a_wider_band_moves_the_recommendation_off_the_memory_edge():
    site, job, space = setup(margin=0.05)
    model = LinearModel(act=2.5e9)
    narrow = search(space, model, options=SearchOptions(top_k=3, memory_error={"A100-80": 0.0, "V100-32": 0.0}))
    wide = search(space, model, options=SearchOptions(top_k=3, memory_error={"A100-80": 0.5, "V100-32": 0.5}))
    assert narrow.fastest.index == wide.fastest.index  # the fastest feasible plan does not care
    assert wide.recommended.risk_utilisation <= 1.0
    assert wide.recommended.prediction.max_utilisation <= 1 / 1.5 + 1e-12
    assert wide.risk_feasible < narrow.risk_feasible


def test_answer_does_not_depend_on_block_size_or_cache(world, tmp_path):
    site, job, space, model, w, rows = world
    a = search(space, model, options=SearchOptions(top_k=5, weights=w))
    b = search(space, model, options=SearchOptions(top_k=5, weights=w, block_size=17))
    counting = LinearModel()
    c = search(space, counting, options=SearchOptions(top_k=5, weights=w, use_cache=False, block_size=4096))
    assert [s.index for s in a.top] == [s.index for s in b.top] == [s.index for s in c.top]
    assert [p.index for p in a.pareto] == [p.index for p in c.pareto]
    # without the signature table every stage of every plan is asked of the model
    assert c.stats.cache["predicted"] == c.stats.cache["lookups"] > len(space)
    assert c.stats.cache["hit_rate"] == pytest.approx(0.0)


def test_infeasible_plans_are_never_ranked():
    site, job, space = setup(margin=0.5)
    model = LinearModel(act=3e9)
    r = search(space, model, options=SearchOptions(top_k=50, weights=TIME_ONLY))
    assert r.stats.feasible < r.stats.plans
    for s in r.top + r.time_top:
        assert s.prediction.feasible
        assert all(st.peak_bytes <= 0.5 * st.capacity_bytes for st in s.prediction.stages)
    # memory-aware weights prefer lower peaks than time-only
    m = search(space, model, options=SearchOptions(top_k=1, weights=Weights(time=1, memory=4, balance=0)))
    assert m.top[0].prediction.max_utilisation <= r.top[0].prediction.max_utilisation


def test_nothing_fits():
    site, job, space = setup(margin=0.9)
    r = search(space, LinearModel(act=1e11), options=SearchOptions(top_k=3))
    assert r.top == () and r.time_top == () and r.pareto == () and r.stats.feasible == 0


def test_cache_file_hits_on_the_second_run(world, tmp_path):
    site, job, space, model, w, rows = world
    path = tmp_path / "c.sqlite"
    first = search(space, model, options=SearchOptions(top_k=3), cache=PredictionCache(identity=model.identity,
                                                                                         path=path))
    second = search(space, model, options=SearchOptions(top_k=3), cache=PredictionCache(identity=model.identity,
                                                                                          path=path))
    assert first.stats.cache["predicted"] == first.stats.cache["unique"] > 0
    assert second.stats.cache["predicted"] == 0 and second.stats.cache["file_hits"] == second.stats.cache["unique"]
    assert first.stats.cache["hit_rate"] > 0.9  # stage look-ups served from the table
    other = LinearModel(tag="refit")
    third = search(space, other, options=SearchOptions(top_k=3), cache=PredictionCache(identity=other.identity,
                                                                                         path=path))
    assert third.stats.cache["invalidated"] == first.stats.cache["unique"]
    assert [s.index for s in first.top] == [s.index for s in second.top]


def test_serial_without_mpi_env(monkeypatch):
    for v in ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE",
              "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(v, raising=False)
    assert not launched_under_mpi() and mpi_comm() is None
    with pytest.raises(SystemFailure, match="mpiexec"):
        mpi_comm(required=True)
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "1")
    assert not launched_under_mpi()


# --------------------------------------------------------------------------- the commands (main(argv))

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "site_configs" / "example-cross-vendor.yaml")


def _plan_args(tmp_path, *extra):
    # --no-reference: an empty store, so these tests exercise the datasheet path without a fit
    return ["plan", "--site", EXAMPLE, "--job", str(ROOT / "jobs" / "gpt3-2.7b.yaml"), "--no-profile", "--no-reference",
            "--store", str(tmp_path / "store.h5"), "--out", str(tmp_path / "out"), "--max-stages", "2",
            "--top", "4", *extra]


def test_plan_command_writes_plans_png_and_says_where_numbers_come_from(tmp_path, capsys):
    assert main(_plan_args(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "estimated from datasheet figures only" in out and "time#" in out and "mem+err" in out
    assert "A100-80" in out and "note: --no-profile" in out
    # the three picks, each with one line on time, headroom and OOM risk
    for words in ("recommended ", "fastest that fits ", "MemX weighted best "):
        assert words in out
    # the memory band of an imported type names the benchmark it was learned from
    from memx_hpc.model.api import Basis
    from memx_hpc.search.objective import table_band
    script = table_band("A100-80", Basis(kind="imported")).source.split(": ", 1)[1].split(",")[0]
    assert script.startswith("benchmarks/") and script.endswith(".py")
    assert "OOM risk" in out and script in out
    # every table line fits 120 columns; the footer explains score and balance
    table_lines = out.split("top 4,")[1].split("Pareto front")[0].splitlines()[1:]
    assert table_lines and max(len(x) for x in table_lines) <= 120
    assert "score: T^1*M^0.5*B^0.5" in out and "bal: fullest/mean GPU memory" in out
    runs = [p for p in (tmp_path / "out").iterdir() if p.name != "latest"]
    assert len(runs) == 1 and (tmp_path / "out" / "latest").resolve() == runs[0].resolve()
    run = tmp_path / "out" / "latest"
    files = sorted(p.name for p in run.iterdir())
    assert files == ["fastest.json", "pareto.png", "plan-01.json", "plan-02.json", "plan-03.json", "plan-04.json",
                     "recommended.json", "summary.json", "weighted.json"]
    assert (run / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from memx_hpc.planfile import job_fingerprint, load_plan
    from memx_hpc.spec import load_job
    plan = load_plan(run / "plan-01.json")
    doc = json.loads((run / "plan-01.json").read_text())
    assert doc["rank"] == 1 and doc["provenance"]["A100-80"] == "datasheet-only"
    assert doc["prediction"]["feasible"] and doc["prediction"]["time_only_rank"] >= 1
    assert doc["job"]["fingerprint"] == job_fingerprint(load_job(ROOT / "jobs" / "gpt3-2.7b.yaml"))
    assert doc["site"] == "example-cross-vendor" and doc["role"] == "recommended"
    assert load_plan(run / "recommended.json") == plan  # plan-01 of the default ranking is the recommended plan
    summary = json.loads((run / "summary.json").read_text())
    assert summary["recommended"]["index"] == summary["top"][0]["index"]
    assert summary["fastest"]["index"] == summary["time_only"][0]["index"]
    assert summary["weighted"]["index"] == summary["weighted_top"][0]["index"]
    assert summary["recommended"]["risk_utilisation"] <= 1.0
    assert summary["fastest"]["prediction"]["iteration_ms"] <= summary["recommended"]["prediction"]["iteration_ms"]
    # predict gives the same numbers for the written plan
    assert main(["predict", "--site", EXAMPLE, "--job", str(ROOT / "jobs" / "gpt3-2.7b.yaml"),
                 "--store", str(tmp_path / "store.h5"), "--plan", str(run / "plan-01.json"),
                 "--no-reference", "--json"]) == 0
    pred = json.loads(capsys.readouterr().out)
    assert pred["iteration_ms"] == pytest.approx(doc["prediction"]["iteration_ms"])
    assert plan.pp == len(pred["stage_ms"])
    # every link between the plan's partitions, with where its figure came from (no store
    # curves and no link_curves_from: the site file's figures, or labelled generic ones)
    parts = {s.partition for s in plan.stages}
    assert pred["links"] and all({x.strip() for x in r["link"].split("<->")} <= parts for r in pred["links"])
    assert {r["provenance"] for r in pred["links"]} <= {"site-figure", "generic"}
    assert any(r["scope"] == "intra" and r["provenance"] == "generic" and "datasheet" in r["source"]
               for r in pred["links"])
    assert pred["source_disagreements"] == []  # an empty store: nothing to compare
    # the second run finds every signature in the cache file next to the store, and writes a new folder:
    # with --top 2 nothing of the first run's plan-03/04 is beside its plans
    assert main(_plan_args(tmp_path, "--json", "--top", "2")) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["stats"]["cache"]["predicted"] == 0 and summary["stats"]["cache"]["file_hits"] > 0
    assert (tmp_path / "store.cache.sqlite").is_file()
    assert len([p for p in (tmp_path / "out").iterdir() if p.name != "latest"]) == 2
    latest = sorted(p.name for p in (tmp_path / "out" / "latest").iterdir())
    assert "plan-03.json" not in latest and "plan-02.json" in latest
    assert (tmp_path / "out" / "latest").resolve().name == summary["run_id"]


def test_plans_belong_to_their_job_and_site(tmp_path, capsys):
    """render/predict refuse a plan made for another job or site, naming both."""
    assert main(_plan_args(tmp_path, "--top", "1")) == 0
    capsys.readouterr()
    plan = tmp_path / "out" / "latest" / "recommended.json"
    llama = str(ROOT / "jobs" / "llama2-7b.yaml")
    for cmd in (["predict", "--store", str(tmp_path / "store.h5")], ["render", "--no-test-only",
                                                                      "--out", str(tmp_path / "x.sbatch")]):
        assert main([*cmd, "--site", EXAMPLE, "--job", llama, "--plan", str(plan)]) == 1
        err = capsys.readouterr().err
        assert "gpt3-2.7b" in err and "llama2-7b" in err and "Traceback" not in err
        assert not (tmp_path / "x.sbatch").exists()
    other = tmp_path / "other.yaml"
    other.write_text(Path(EXAMPLE).read_text().replace("name: example-cross-vendor", "name: elsewhere"))
    assert main(["predict", "--store", str(tmp_path / "store.h5"), "--site", str(other), "--job",
                 str(ROOT / "jobs" / "gpt3-2.7b.yaml"), "--plan", str(plan)]) == 1
    err = capsys.readouterr().err
    assert "example-cross-vendor" in err and "elsewhere" in err
    # a plan without a record (hand-written) is predicted with its own global batch
    doc = json.loads(plan.read_text())
    bare = {k: doc[k] for k in ("format", "tp", "dp", "micro_batch_size", "stages")}
    bare["global_batch_size"] = doc["global_batch_size"] * 2
    (tmp_path / "bare.json").write_text(json.dumps(bare))
    assert main(["predict", "--store", str(tmp_path / "store.h5"), "--site", EXAMPLE, "--job",
                 str(ROOT / "jobs" / "gpt3-2.7b.yaml"), "--plan", str(tmp_path / "bare.json"), "--json"]) == 0
    pred = json.loads(capsys.readouterr().out)
    assert pred["num_microbatches"] == 2 * doc["prediction"]["num_microbatches"]
    assert any("global batch" in n for n in pred["notes"])


def test_time_only_weights_rank_by_time(tmp_path, capsys):
    assert main(_plan_args(tmp_path, "--objective", "memx", "--weights", "time=1", "--json")) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["weights"] == "time=1,memory=0,balance=0"  # names left out are 0
    assert [t["index"] for t in s["top"]] == [t["index"] for t in s["time_only"]]
    ranks = [t["time_only_rank"] for t in s["top"]]
    assert ranks[0] == 1 and ranks == sorted(ranks)


@pytest.mark.parametrize("weights,needle", [("speed=1", "unknown weight name"), ("time=-2", ">= 0")])
def test_bad_weights_exit_1_without_traceback(tmp_path, capsys, weights, needle):
    assert main(_plan_args(tmp_path, "--weights", weights)) == 1
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and "--weights" in err


def test_predict_general_plan(tmp_path, capsys):
    plan = {"format": "memx-plan/1", "micro_batch_size": 1, "global_batch_size": 64,
            "stages": [{"num_layers": 16, "replicas": [{"gpu_type": "A100-80", "tp": 2},
                                                       {"gpu_type": "V100-32", "tp": 4}]},
                       {"num_layers": 16, "recompute": "full:8", "replicas": [{"gpu_type": "MI250X-GCD", "tp": 2}]}]}
    path = tmp_path / "general.json"
    path.write_text(json.dumps(plan))
    assert main(["predict", "--site", EXAMPLE, "--job", str(ROOT / "jobs" / "gpt3-2.7b.yaml"), "--store",
                 str(tmp_path / "none.h5"), "--plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "general plan" in out and "V100-32" in out and "full:8" in out
    plan["stages"][0]["num_layers"] = 15
    path.write_text(json.dumps(plan))
    assert main(["predict", "--site", EXAMPLE, "--job", str(ROOT / "jobs" / "gpt3-2.7b.yaml"), "--store",
                 str(tmp_path / "none.h5"), "--plan", str(path)]) == 1
    assert "31 layers" in capsys.readouterr().err


def test_simulate_scales_the_site(tmp_path, capsys):
    assert main(["simulate", "--site", EXAMPLE, "--job", str(ROOT / "jobs" / "gpt3-2.7b.yaml"), "--store",
                 str(tmp_path / "s.h5"), "--scale", "40", "--max-stages", "2", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert [x["gpus"] for x in s["scales"]] == [20, 40]
    assert s["scales"][1]["plans"] > s["scales"][0]["plans"]
    check = s["scales"][0]["best_check"]
    assert check["pipeline_ms_search"] == pytest.approx(check["pipeline_ms_event_driven"])


def test_top_k_lists_each_runnable_plan_once():
    """A fractional full-recompute level on one-layer stages decodes to plain full recompute;
    the report must not show the same plan twice."""
    from memx_hpc.model.api import AnalyticCostModel
    from memx_hpc.search.engine import SearchOptions, search
    from memx_hpc.search.space import PlanSpace
    from memx_hpc.spec import load_job, load_site

    root = Path(__file__).resolve().parents[2]
    site = load_site(root / "site_configs/local.yaml")
    job = load_job(root / "jobs/tiny-gpt.yaml")
    space = PlanSpace(site, job)
    res = search(space, AnalyticCostModel(site), options=SearchOptions(top_k=20, use_cache=False))
    plans = [s.plan for s in res.top]
    assert len(plans) == 20 and len(set(plans)) == len(plans)
    tplans = [s.plan for s in res.time_top]
    assert len(set(tplans)) == len(tplans)
    scores = [s.score for s in res.top]
    assert scores == sorted(scores)


class HostBoundModel(LinearModel):
    """Layers of microseconds and a measured host cost per operator: every layer sits at its
    host-dispatch floor (memx_hpc.model.host), which the search must compose as the
    one-plan path does."""

    T = {"A100-80": 0.01, "V100-32": 0.02}
    host_us_per_op = 100.0


def test_search_composes_the_cost_models_host_floor():
    site, job, space = setup()
    model = HostBoundModel(tag="host")
    rows = brute(space, model, TIME_ONLY)
    r = search(space, model, options=SearchOptions(top_k=3, weights=TIME_ONLY))
    best = min(t for _, _, t, _ in rows)
    assert r.time_top[0].prediction.iteration_ms == pytest.approx(best, rel=1e-9)
    # the composed times (the Pareto front's) are the scalar path's, floor included
    front = {(t, u) for _, _, t, u in rows
             if not any(t2 <= t and u2 <= u and (t2 < t or u2 < u) for _, _, t2, u2 in rows)}
    got = sorted((p.iteration_ms, p.max_utilisation) for p in r.pareto)
    assert len(got) == len(front) and np.allclose(got, sorted(front), rtol=1e-12)
    # the floor is the model's 100 us per operator, not the prior's
    from memx_hpc.model import host
    s = r.time_top[0].prediction.stages[0]
    per_layer = host.layer_host_ms("none", s.tp, 100.0)
    assert s.time_ms >= s.num_layers * per_layer - 1e-9
    assert per_layer > host.layer_host_ms("full", s.tp)  # far above the prior's floor


# --------------------------------------------------------------------------- virtual, context and expert parallel


def _degrees_space(moe: bool, hidden_dropout: float = 0.1):
    site = Site(name="hopper", partitions=(Partition(name="pH", gpu_type="H100-SXM", nodes=2, gpus_per_node=4),
                                           Partition(name="pA", gpu_type="A100-80", nodes=1, gpus_per_node=4)),
                links=(Link(a="pH", b="pA", gbps=10.0),))
    kw = dict(num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=1024) if moe else {}
    m = ModelSpec(name="long", num_layers=4, hidden_size=1024, num_attention_heads=8, num_query_groups=8,
                  ffn_hidden_size=4096, vocab_size=1000, seq_length=16384, hidden_dropout=hidden_dropout, **kw)
    job = job_for_model(m, 8, distributed_optimizer_searched=True)  # and with / without the distributed optimizer
    space = PlanSpace(site, job, SpaceOptions(layer_granularity=1, max_pipeline_stages=2, tp_degrees=(1, 2),
                                              micro_batch_sizes=(1,)))
    return space


class _Linear(LinearModel):
    T = {"A100-80": 10.0, "V100-32": 25.0, "H100-SXM": 4.0}


@pytest.mark.parametrize("moe,dropout", [(False, 0.1), (True, 0.1), (False, 0.0)])
def test_the_search_prices_virtual_context_and_expert_parallel_as_one_plan_is_predicted(moe, dropout):
    """Every plan of a space with VP, CP (and EP for an MoE model) composed in blocks equals
    predict_plan on it: one composition for the search and for predict (a dropout-free model's
    masks taken out of the activations on both paths)."""
    from memx_hpc.model.compose import Composer, required_queries
    space = _degrees_space(moe, dropout)
    kinds = {(s.vp, s.cp, s.ep) for s in space.skeletons}
    assert any(v > 1 for v, _, _ in kinds) and any(c > 1 for _, c, _ in kinds)
    assert any(e > 1 for _, _, e in kinds) == moe
    assert {s.distributed_optimizer for s in space.skeletons} == {None, True, False}
    model = _Linear(act=2e8)
    inputs = space.composition_inputs()
    qs = required_queries(inputs)
    preds = dict(zip(qs, map(tuple, model.predict(qs))))
    comp = Composer(inputs, preds, overhead_bytes={g: GiB for g in ("H100-SXM", "A100-80")})
    cost = comp.compose(space.decode(0, len(space)))
    for i, plan in space.iter_range(0, len(space)):
        p = predict_plan(plan, space.site, space.job, model)
        assert p.feasible == bool(cost.feasible[i])
        if p.feasible:
            assert p.iteration_ms == pytest.approx(float(cost.iteration_ms[i]), rel=1e-9)
        assert p.max_utilisation == pytest.approx(float(cost.max_utilisation[i]), rel=1e-9)


def test_plans_set_aside_by_the_margin_alone_equal_brute_force():
    """A plan within every GPU's capacity but over the site's safety margin is not searched
    as fitting, but the fastest of them is kept apart, with their count, and the report
    names it with the margin that would admit it; that margin does."""
    from memx_hpc.search.report import explain, margin_aside_words
    site, job, space = setup(margin=0.2)
    model = LinearModel(act=8e9)  # activations heavy enough that the fastest plans sit near capacity
    aside, fit = [], []
    for i, plan in space.iter_range(0, len(space)):
        p = predict_plan(plan, space.site, space.job, model)
        (fit if p.feasible else aside if p.max_utilisation <= 1.0 else []).append((p.iteration_ms, i))
    assert aside and fit and min(aside)[0] < min(fit)[0]
    r = search(space, model, options=SearchOptions(top_k=3, block_size=61))
    assert r.margin_aside_count == len(aside)
    assert r.margin_aside is not None and not r.margin_aside.prediction.feasible
    assert r.margin_aside.prediction.iteration_ms == pytest.approx(min(aside)[0], rel=1e-9)
    assert 0.8 < r.margin_aside.prediction.max_utilisation <= 1.0
    words = margin_aside_words(r, 0.2)
    assert words is not None and words in explain(r, margin=0.2)
    assert f"{len(aside):,} plans fit every GPU's capacity" in words
    admit = float(words.rsplit("memory_safety_margin: ", 1)[1].split()[0])
    assert 0.0 <= admit < 0.2
    site2, _, _ = setup(margin=admit)
    assert predict_plan(space.plan_at(r.margin_aside.index), site2, space.job, model).feasible
    # where the plans set aside are slower than the fastest that fits, the report says nothing
    _, _, space3 = setup(margin=0.3)
    r3 = search(space3, LinearModel(act=2.5e9), options=SearchOptions(top_k=3))
    assert r3.margin_aside is not None and r3.margin_aside.prediction.iteration_ms > r3.fastest.prediction.iteration_ms
    assert margin_aside_words(r3, 0.3) is None
    # no margin: nothing is set aside
    _, _, space0 = setup(margin=0.0)
    r0 = search(space0, model, options=SearchOptions(top_k=3))
    assert r0.margin_aside is None and r0.margin_aside_count == 0 and margin_aside_words(r0, 0.0) is None
