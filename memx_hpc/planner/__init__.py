"""The planner as a library: a typed :class:`PlanRequest` in, a :class:`PlanResult` out.

Every CLI command reaches the model and the search through here; the CLI parses arguments
and prints. The rooms, one purpose each:

- :mod:`~memx_hpc.planner.request`: the request and result types (and the finish goal);
- :mod:`~memx_hpc.planner.conductor`: :func:`plan` (profile what is missing, assemble the
  cost model, search, write the plan files), search options, MPI;
- :mod:`~memx_hpc.planner.predict`: one plan file predicted (``memx-hpc predict``);
- :mod:`~memx_hpc.planner.simulate`: the site and larger copies of it searched with one
  cost model (``memx-hpc simulate``);
- :mod:`~memx_hpc.planner.finish`: plans ranked by when Slurm would finish them (``--finish``);
- :mod:`~memx_hpc.planner.verify`: plans measured for real and the calibration refitted;
- :mod:`~memx_hpc.planner.resume`: a job continued from a checkpoint of its model;
- :mod:`~memx_hpc.planner.ranks`: under MPI, whether the ranks share a search (rank 0 decides,
  the others wait for it before importing anything heavy);
- :mod:`~memx_hpc.planner.render`: a plan file rendered into its sbatch script, and the script
  written, checked and submitted (``render``);
- :mod:`~memx_hpc.planner.runs`: where a rendered run stands (its segments, checkpoint, why it
  stopped), and what is in place for a site (Slurm, the store, the predictor: ``status``);
- :mod:`~memx_hpc.planner.space`: the plan space as far as ``render`` would launch it, and why
  a space holds no plan;
- :mod:`~memx_hpc.planner.fit`: the predictor fitted on the store and cross-validated (``fit``);
- :mod:`~memx_hpc.planner.profiling`: the minimal set measured, the store listed, imported into
  and exported (``profile``, ``profile ls|import|export``);
- :mod:`~memx_hpc.planner.cluster`: whether Slurm answers, and the site its partitions support
  (``site discover``);
- :mod:`~memx_hpc.planner.data`: a training data set tokenized for the job file (``data prepare``).

Option types the CLI builds (:class:`SpaceOptions`, :class:`CostOptions`, :class:`Weights`) are
re-exported here: the CLI builds them without reaching below the planner (test_layers checks it).

The cost model itself is assembled in :mod:`memx_hpc.model.assemble` (re-exported here).

Example::

    from memx_hpc.planner import PlanRequest, plan
    result = plan(PlanRequest(site="site_configs/local.yaml", job="jobs/tiny-gpt.yaml", top_k=5))
    best = result.ranked[0]              # ScoredPlan: .plan, .prediction, .score, .rank
    result.search.fastest, result.search.weighted_best, result.bands
    result.notes, result.files, result.summary
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING

# Each name is imported from its room when first asked for (PEP 562), so a command loads
# the rooms it uses and not the others (plan needs neither verify's train/ nor the site
# discovery). The same imports, for type checkers and tests/unit/test_layers.py:
if TYPE_CHECKING:
    from ..model.assemble import (MIN_TYPES_FOR_DATASHEET_TRANSFER, StorePaths, base_of, bases_of, calibrated,
                                  consistent_sources, eager_layer_notes, load_cost_model, provenance_of, start_store,
                                  store_paths)
    from ..model.compose import CostOptions
    from ..search.objective import Weights
    from ..search.space import CP_MIN_TOKENS, DEFAULT_VIRTUAL_STAGES, SpaceOptions
    from .cluster import discover_site, require_slurm
    from .conductor import (error_bands, load_specs, plan, prepare, profile_missing, rule_fallback, search_options,
                            submit_best)
    from .data import DataRequest, prepare_data
    from .finish import (FinishCandidate, FinishGoal, FinishRanking, cluster_view, finish_order, parse_finish,
                         rank_by_finish, submit_finish, usable_site)
    from .fit import FitRequest, FitResult, fit
    from .predict import PredictRequest, PredictResult, predict
    from .profiling import (IMPORT_FORMATS, ExportRequest, ExportResult, ImportRequest, ImportResult, ProfileRequest,
                            ProfileResult, StoreListing, StoreRequest, export_samples, import_samples, list_store,
                            profile_site, profile_store_path, source_disagreements)
    from .ranks import MIN_PLANS_PER_RANK, ranks_follow, tell_ranks_failed
    from .render import RenderedPlan, check_script, launch_script, render_plan
    from .request import PlanRequest, PlanResult, Prepared
    from .resume import model_differences, resume_job
    from .runs import RunStatus, Segment, SiteStatus, run_status, site_status
    from .simulate import ScaledSearch, ScaleResult, best_plan_check, max_scale_gpus, scale_site, simulate_scales
    from .space import launchable_space, why_empty
    from .verify import (VerifyRequest, VerifyResult, VerifyRow, _rows_mape, _verify_row,  # noqa: F401 - tests read these
                         plan_file_entries, verify)

#: name -> the module (relative to this package) it lives in
_ROOM_OF = {
    "MIN_TYPES_FOR_DATASHEET_TRANSFER": "..model.assemble",
    "StorePaths": "..model.assemble",
    "base_of": "..model.assemble",
    "bases_of": "..model.assemble",
    "calibrated": "..model.assemble",
    "consistent_sources": "..model.assemble",
    "eager_layer_notes": "..model.assemble",
    "load_cost_model": "..model.assemble",
    "provenance_of": "..model.assemble",
    "start_store": "..model.assemble",
    "store_paths": "..model.assemble",
    "CostOptions": "..model.compose",
    "Weights": "..search.objective",
    "CP_MIN_TOKENS": "..search.space",
    "DEFAULT_VIRTUAL_STAGES": "..search.space",
    "SpaceOptions": "..search.space",
    "discover_site": ".cluster",
    "require_slurm": ".cluster",
    "MIN_PLANS_PER_RANK": ".ranks",
    "ranks_follow": ".ranks",
    "tell_ranks_failed": ".ranks",
    "error_bands": ".conductor",
    "load_specs": ".conductor",
    "plan": ".conductor",
    "prepare": ".conductor",
    "profile_missing": ".conductor",
    "rule_fallback": ".conductor",
    "search_options": ".conductor",
    "submit_best": ".conductor",
    "DataRequest": ".data",
    "prepare_data": ".data",
    "FinishCandidate": ".finish",
    "FinishGoal": ".finish",
    "FinishRanking": ".finish",
    "cluster_view": ".finish",
    "finish_order": ".finish",
    "parse_finish": ".finish",
    "rank_by_finish": ".finish",
    "submit_finish": ".finish",
    "usable_site": ".finish",
    "FitRequest": ".fit",
    "FitResult": ".fit",
    "fit": ".fit",
    "PredictRequest": ".predict",
    "PredictResult": ".predict",
    "predict": ".predict",
    "IMPORT_FORMATS": ".profiling",
    "ExportRequest": ".profiling",
    "ExportResult": ".profiling",
    "ImportRequest": ".profiling",
    "ImportResult": ".profiling",
    "ProfileRequest": ".profiling",
    "ProfileResult": ".profiling",
    "StoreListing": ".profiling",
    "StoreRequest": ".profiling",
    "export_samples": ".profiling",
    "import_samples": ".profiling",
    "list_store": ".profiling",
    "profile_site": ".profiling",
    "profile_store_path": ".profiling",
    "source_disagreements": ".profiling",
    "RenderedPlan": ".render",
    "check_script": ".render",
    "launch_script": ".render",
    "render_plan": ".render",
    "PlanRequest": ".request",
    "PlanResult": ".request",
    "Prepared": ".request",
    "model_differences": ".resume",
    "resume_job": ".resume",
    "RunStatus": ".runs",
    "Segment": ".runs",
    "run_status": ".runs",
    "SiteStatus": ".runs",
    "site_status": ".runs",
    "ScaledSearch": ".simulate",
    "ScaleResult": ".simulate",
    "best_plan_check": ".simulate",
    "max_scale_gpus": ".simulate",
    "scale_site": ".simulate",
    "simulate_scales": ".simulate",
    "launchable_space": ".space",
    "why_empty": ".space",
    "VerifyRequest": ".verify",
    "VerifyResult": ".verify",
    "VerifyRow": ".verify",
    "_rows_mape": ".verify",
    "_verify_row": ".verify",
    "plan_file_entries": ".verify",
    "verify": ".verify",
}


class _Package(types.ModuleType):
    """This package, keeping a function's name when the import system loads the room of the
    same name: ``fit``, ``predict`` and ``verify`` are functions here (as the eager imports
    left them), not the modules ``planner/fit.py`` ... that loading one would bind them to."""

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, types.ModuleType) and _ROOM_OF.get(name) == f".{name}":
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str):
    room = _ROOM_OF.get(name)
    if room is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(room, __name__), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ROOM_OF))


__all__ = ["CostOptions", "MIN_TYPES_FOR_DATASHEET_TRANSFER", "MIN_PLANS_PER_RANK", "PlanRequest", "PlanResult",
           "ScaleResult", "ScaledSearch", "StorePaths", "base_of", "bases_of", "calibrated", "consistent_sources",
           "eager_layer_notes", "error_bands", "load_cost_model", "load_specs", "plan", "prepare", "Prepared",
           "profile_missing", "provenance_of", "rule_fallback", "scale_site", "max_scale_gpus", "search_options",
           "simulate_scales", "start_store", "store_paths", "submit_best", "best_plan_check", "launchable_space",
           "VerifyRequest", "VerifyResult", "VerifyRow", "plan_file_entries", "verify", "FinishGoal",
           "parse_finish", "FinishCandidate", "FinishRanking", "usable_site", "cluster_view", "rank_by_finish",
           "finish_order", "submit_finish", "resume_job", "model_differences", "PredictRequest", "PredictResult",
           "predict", "SpaceOptions", "Weights", "why_empty", "FitRequest", "FitResult", "fit", "IMPORT_FORMATS",
           "StoreRequest", "StoreListing", "list_store", "ImportRequest", "ImportResult", "import_samples",
           "ExportRequest", "ExportResult", "export_samples", "ProfileRequest", "ProfileResult", "profile_site",
           "profile_store_path", "source_disagreements", "require_slurm", "discover_site",
           "CP_MIN_TOKENS", "DEFAULT_VIRTUAL_STAGES", "DataRequest", "prepare_data", "RunStatus", "Segment",
           "run_status", "RenderedPlan", "render_plan", "launch_script", "check_script",
           "SiteStatus", "site_status", "ranks_follow", "tell_ranks_failed"]
