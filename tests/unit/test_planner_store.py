"""The planner's store, fit and Slurm functions that ``profile``, ``fit``, ``plan`` and
``site discover`` call: typed requests in, typed results out, the same answers as the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memx_hpc.datapaths import sailor_dir
from memx_hpc.errors import SpecError, SystemFailure
from memx_hpc.planner import (ExportRequest, FitRequest, ImportRequest, StoreRequest, export_samples, fit,
                              import_samples, list_store, profile_store_path, require_slurm)

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "site_configs" / "local.yaml"


def test_the_store_is_the_option_then_the_sites_then_the_environment(tmp_path, monkeypatch):
    from memx_hpc.spec import load_site
    monkeypatch.delenv("MEMX_STORE", raising=False)
    site = load_site(LOCAL)
    assert profile_store_path(tmp_path / "a.h5", site) == tmp_path / "a.h5"
    assert profile_store_path(None, site) == site.store
    with pytest.raises(SpecError, match="no profile store given") as e:
        profile_store_path(None)
    assert e.value.field == "--store"
    monkeypatch.setenv("MEMX_STORE", str(tmp_path / "env.h5"))
    assert profile_store_path(None) == tmp_path / "env.h5"


def test_import_list_and_export_round_trip(tmp_path):
    store = tmp_path / "s.h5"
    sailor = sailor_dir()
    with pytest.raises(SpecError, match="does not exist"):
        list_store(StoreRequest(store=store))
    first = import_samples(ImportRequest(path=sailor, format="sailor", store=store))
    assert first.read == first.added > 0 and first.to_json()["duplicates_skipped"] == 0
    again = import_samples(ImportRequest(path=sailor, format="sailor", store=store))
    assert again.added == 0 and again.to_json()["duplicates_skipped"] == again.read
    listing = list_store(StoreRequest(store=store))
    assert sum(r["samples"] for r in listing.gpu_types) == first.added and listing.coverage is None
    assert json.loads(json.dumps(listing.to_json(), default=str))["store"] == str(store)
    out = export_samples(ExportRequest(csv=str(tmp_path / "s.csv"), store=store))
    assert out.rows == first.added
    back = import_samples(ImportRequest(path=tmp_path / "s.csv", store=tmp_path / "t.h5"))
    assert back.added == first.added
    with pytest.raises(SpecError, match="file or folder not found"):
        import_samples(ImportRequest(path=tmp_path / "missing.csv", store=store))
    with pytest.raises(SpecError, match="unknown import format"):
        import_samples(ImportRequest(path=tmp_path / "s.csv", format="xlsx", store=store))


def test_fit_saves_the_predictor_beside_the_store(tmp_path):
    store = tmp_path / "s.h5"
    import_samples(ImportRequest(path=sailor_dir(), format="sailor", store=store))
    steps = []

    class Step:
        def __init__(self, label):
            steps.append(label)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    res = fit(FitRequest(site=LOCAL, store=store, cross_validate=False, progress=False), step=Step)
    assert res.cross_validation is None and res.path.is_file() and res.samples > 0
    assert [s.split(" ")[1] for s in steps] == ["reading", "fitting"]
    d = res.to_json()
    assert d["predictor"] == str(res.path) and d["identity"] == res.predictor.identity
    with pytest.raises(SpecError, match="profile store not found"):
        fit(FitRequest(site=LOCAL, store=tmp_path / "none.h5", reference=False, progress=False))


def test_require_slurm_names_what_needed_it(monkeypatch):
    from memx_hpc.slurm import local_cluster
    monkeypatch.setattr(local_cluster, "slurm_available", lambda timeout=5.0: False)
    with pytest.raises(SystemFailure) as e:
        require_slurm("--submit: Slurm does not answer (sinfo), nothing was submitted.")
    assert str(e.value) == f"--submit: Slurm does not answer (sinfo), nothing was submitted. {local_cluster.START_HINT}"
    monkeypatch.setattr(local_cluster, "slurm_available", lambda timeout=5.0: True)
    require_slurm("never said")
