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
#: sits beside train, below the planner, which asks Slurm for the cluster and hands it over.
RANK = {"<foundation>": 0, "slurm": 1, "profile": 2, "model": 3, "search": 4, "train": 5, "sitegen": 5, "planner": 6,
        "cli": 7, "__main__": 8}
FOUNDATION = {"__init__", "errors", "spec", "datapaths", "records", "planfile", "megatron_cpu", "data",
              "tables", "shellsafe", "params", "placement", "megatron_args"}


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
    ("from ..planner import plan\n", "memx_hpc.spec.site"),
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


def import_graph() -> dict[str, set[str]]:
    """Module -> the memx_hpc modules it imports (every import counts, as above). ``from
    .pkg.sub import x`` is an edge to ``pkg.sub``; an edge to a module passes through the
    ``__init__`` of each package above it, which Python runs first."""
    names = {module_name(p): p for p in all_modules()}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        out = graph.setdefault(name, set())
        for _line, target in imported(ast.parse(path.read_text(encoding="utf-8")), name, path.name == "__init__.py"):
            parts = target.split(".")
            for k in range(1, len(parts) + 1):
                dotted = ".".join(parts[:k])
                if dotted in names and dotted != name and not name.startswith(dotted + "."):
                    out.add(dotted)
    return graph


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` as the modules along it, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_circle():
    """No module of memx_hpc imports, through any chain, itself (local and type-only imports
    count: a circle dodged by a function-level import is still a circle)."""
    circle = find_circle(import_graph())
    assert circle is None, "an import circle: " + " -> ".join(circle)


def test_the_circle_finder_sees_a_circle_through_a_local_import():
    graph = {"memx_hpc.spec.site": {"memx_hpc.spec.catalog"}, "memx_hpc.spec.catalog": {"memx_hpc.spec.readers"},
             "memx_hpc.spec.readers": {"memx_hpc.spec.site"}}
    assert find_circle(graph) == ["memx_hpc.spec.catalog", "memx_hpc.spec.readers", "memx_hpc.spec.site",
                                  "memx_hpc.spec.catalog"]
    assert find_circle({"a": {"b"}, "b": set()}) is None
    src = "def f():\n    from .catalog import catalog\n"
    assert imported(ast.parse(src), "memx_hpc.spec.site", False) == [(2, "memx_hpc.spec.catalog")]


#: What the CLI may import from the rooms below the planner, by module and name: helpers that
#: only format what the planner answered (tables, progress bars, JSON rows). Everything else
#: goes through memx_hpc.planner.
CLI_PRINTING_HELPERS = {
    "memx_hpc.search.report": {"ROLES", "explain", "table_rows", "table_footer", "link_rows", "stage_summary",
                               "scored_to_dict", "coverage_table", "admitting_margin"},
}
#: Commands that still reach past the planner, and why they are left so for now (none: status
#: and render go through planner/runs.py and planner/render.py).
CLI_NOT_YET_THROUGH_THE_PLANNER: dict[str, set[str]] = {}
BELOW_THE_PLANNER = {"model", "profile", "search", "train", "slurm"}


def cli_reaches_past_the_planner(source: str, module: str) -> list[str]:
    """Imports of ``module`` (a CLI module) from model/, profile/, search/, train/ or slurm/
    that neither the printing helpers nor the module's own exception allow."""
    package = module.split(".")[:-1]
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - (node.level - 1)] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            found = [(target, a.name) for a in node.names]
        else:
            continue
        for target, name in found:
            parts = target.split(".")
            if parts[0] != "memx_hpc" or len(parts) < 2 or parts[1] not in BELOW_THE_PLANNER:
                continue
            if name is not None and name in CLI_PRINTING_HELPERS.get(target, ()):
                continue
            if target in CLI_NOT_YET_THROUGH_THE_PLANNER.get(module, ()):
                continue
            bad.append(f"{module}:{node.lineno} imports {name or '*'} from {target}")
    return bad


def test_every_cli_command_goes_through_the_planner():
    """The CLI parses arguments and prints; what it runs, it asks the planner for."""
    bad = []
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        bad += cli_reaches_past_the_planner(path.read_text(encoding="utf-8"), module_name(path))
    assert not bad, "CLI imports that go around the planner:\n" + "\n".join(bad)


def test_the_cli_checker_sees_imports_around_the_planner():
    assert cli_reaches_past_the_planner("def run():\n    from ..model.predictor import Predictor\n",
                                        "memx_hpc.cli.fit")
    assert cli_reaches_past_the_planner("import memx_hpc.profile.store\n", "memx_hpc.cli.profile")
    assert cli_reaches_past_the_planner("from ..search.report import coverage\n", "memx_hpc.cli.profile")
    assert cli_reaches_past_the_planner("from ..slurm.render import render\n", "memx_hpc.cli.plan")
    assert cli_reaches_past_the_planner("from ..search.report import table_rows\n", "memx_hpc.cli.search") == []
    assert cli_reaches_past_the_planner("from ..planner import fit\nfrom ..spec import load_site\n",
                                        "memx_hpc.cli.fit") == []
