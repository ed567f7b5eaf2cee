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
- :mod:`~memx_hpc.planner.runs`: where a rendered run stands (its segments, checkpoint, why it stopped);
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

from ..model.assemble import (MIN_TYPES_FOR_DATASHEET_TRANSFER, StorePaths, base_of, bases_of, calibrated,
                              consistent_sources, eager_layer_notes, load_cost_model, provenance_of, start_store,
                              store_paths)
from ..model.compose import CostOptions
from ..search.objective import Weights
from ..search.space import CP_MIN_TOKENS, DEFAULT_VIRTUAL_STAGES, SpaceOptions
from .cluster import discover_site, require_slurm
from .conductor import (MIN_PLANS_PER_RANK, error_bands, load_specs, plan, prepare, profile_missing, rule_fallback,
                        search_options, submit_best)
from .data import DataRequest, prepare_data
from .finish import (FinishCandidate, FinishGoal, FinishRanking, cluster_view, finish_order, parse_finish,
                     rank_by_finish, submit_finish, usable_site)
from .fit import FitRequest, FitResult, fit
from .predict import PredictRequest, PredictResult, predict
from .profiling import (IMPORT_FORMATS, ExportRequest, ExportResult, ImportRequest, ImportResult, ProfileRequest,
                        ProfileResult, StoreListing, StoreRequest, export_samples, import_samples, list_store,
                        profile_site, profile_store_path, source_disagreements)
from .request import PlanRequest, PlanResult, Prepared
from .resume import model_differences, resume_job
from .runs import RunStatus, Segment, run_status
from .simulate import ScaledSearch, ScaleResult, best_plan_check, max_scale_gpus, scale_site, simulate_scales
from .space import launchable_space, why_empty
from .verify import (VerifyRequest, VerifyResult, VerifyRow, _rows_mape, _verify_row,  # noqa: F401 - tests read these
                     plan_file_entries, verify)

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
           "run_status"]
