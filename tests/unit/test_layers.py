"""Imports run one way: a floor of memx_hpc imports only the floors below it.

Every ``import`` and ``from ... import`` in every module under ``memx_hpc/`` counts,
including those inside functions and under ``if TYPE_CHECKING:`` (a local import is
still a dependency; it only runs later).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "memx_hpc"

#: The floors, lowest first. A module may import its own floor's modules and any lower
#: floor. slurm knows Slurm only (requests, job arrays and their states, rendering a
#: placement), so it sits right on the foundation; profile measures through it and stores;
#: model is fitted on what the store holds; search composes and ranks with the model; train
#: and the planner drive them. The foundation: specs, records, plan files, catalog, errors,
#: the placement rule and the like. sitegen (a site file from what slurm/discover reads)
#: sits beside the planner.
RANK = {"<foundation>": 0, "slurm": 1, "profile": 2, "model": 3, "search": 4, "train": 5, "planner": 6, "sitegen": 6,
        "cli": 7, "__main__": 8}
FOUNDATION = {"__init__", "errors", "spec", "catalog", "datapaths", "records", "planfile", "megatron_cpu", "data",
              "tables", "shellsafe", "params", "hfconfig", "placement", "megatron_args"}


def floor_of(module: str) -> str:
    """The floor of a dotted module name under memx_hpc (``memx_hpc.model.compose`` -> model)."""
    parts = module.split(".")
    assert parts[0] == "memx_hpc", module
    if len(parts) == 1:
        return "<foundation>"
    head = parts[1]
    if head in FOUNDATION:
        return "<foundation>"
    if head not in RANK:
        raise AssertionError(f"{module}: a new top-level name; give it a floor in tests/unit/test_layers.py")
    return head


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module) of every memx_hpc import in ``tree``; relative imports resolved."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "memx_hpc"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "memx_hpc":
                continue
            if node.module is None or target == "memx_hpc":
                # ``from . import analytic`` / ``from .. import megatron_cpu``: a name that is a
                # module counts as that module, any other (``__version__``) as the package
                out += [(node.lineno, f"{target}.{a.name}" if _is_module(f"{target}.{a.name}") else target)
                        for a in node.names]
            else:
                out.append((node.lineno, target))
    return out


def _is_module(dotted: str) -> bool:
    path = PACKAGE.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or path.is_dir()


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    here = floor_of(module)
    bad = []
    for line, target in imported(ast.parse(source), module, is_package):
        there = floor_of(target)
        if there == here:
            continue
        if RANK[there] >= RANK[here]:
            bad.append(f"{module}:{line} imports {target} ({there} is not below {here})")
    return bad


def all_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_import_points_down():
    bad = []
    for path in all_modules():
        bad += violations(path.read_text(encoding="utf-8"), module_name(path), path.name == "__init__.py")
    assert not bad, "imports that run upward:\n" + "\n".join(bad)


def test_model_never_imports_search_train_slurm_or_cli():
    """The rule as stated for the model floor, checked on its own."""
    for path in sorted((PACKAGE / "model").rglob("*.py")):
        for line, target in imported(ast.parse(path.read_text(encoding="utf-8")), module_name(path),
                                     path.name == "__init__.py"):
            assert floor_of(target) not in {"search", "train", "slurm", "cli", "planner"}, \
                f"{module_name(path)}:{line} imports {target}"


def test_profile_never_imports_the_model_or_above():
    """What the profiler measures and stores does not depend on the model fitted to it; it
    submits its campaigns through slurm/."""
    for path in sorted((PACKAGE / "profile").rglob("*.py")):
        for line, target in imported(ast.parse(path.read_text(encoding="utf-8")), module_name(path),
                                     path.name == "__init__.py"):
            assert floor_of(target) in {"<foundation>", "slurm", "profile"}, \
                f"{module_name(path)}:{line} imports {target}"


def test_slurm_knows_slurm_only():
    """slurm/ submits arrays of tasks and scripts and says how they went; it never imports
    what is measured (profile/), the model, the search or the run (train/). Campaigns that
    use Slurm live with what they measure."""
    modules = sorted((PACKAGE / "slurm").rglob("*.py"))
    assert {"arrays.py", "request.py", "submit.py", "render.py"} <= {p.name for p in modules}
    for path in modules:
        for line, target in imported(ast.parse(path.read_text(encoding="utf-8")), module_name(path),
                                     path.name == "__init__.py"):
            assert floor_of(target) in {"<foundation>", "slurm"}, f"{module_name(path)}:{line} imports {target}"


@pytest.mark.parametrize("source, module", [
    ("def f():\n    from ..search.cost import predict_plan\n", "memx_hpc.model.calibrate"),
    ("from ..train import measure\n", "memx_hpc.model.calibrate"),
    ("import memx_hpc.cli.search\n", "memx_hpc.planner"),
    ("from ..model.analytic import layer_params\n", "memx_hpc.profile.importers"),
    ("from .planner import plan\n", "memx_hpc.spec"),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .search import engine\n", "memx_hpc.records"),
    ("from ..profile.store import ProfileStore\n", "memx_hpc.slurm.arrays"),
    ("def f():\n    from ..profile.runner import run_task\n", "memx_hpc.slurm.render"),
    ("from ..model.links import CommCurve\n", "memx_hpc.slurm.request"),
])
def test_the_checker_sees_upward_imports(source, module):
    """Each of these runs upward (a local import, an ``import`` statement, a sibling floor,
    a type-only import) and must be reported."""
    assert violations(source, module)


def test_the_checker_accepts_downward_imports():
    src = "from . import analytic\nfrom ..spec import Site\nfrom .api import LayerQuery\nimport numpy\n"
    assert violations(src, "memx_hpc.model.compose") == []
    assert violations("from ..model.compose import predict_plan\n", "memx_hpc.search.engine") == []
