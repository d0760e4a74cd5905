"""``analysis/`` is grouped by feature, and its packages import one another one way: the command
line sits on top, reports render what sweeps stored, and no feature imports a command."""

import ast

import pytest

from tests.conftest import REPO, project_python_files

ANALYSIS = REPO / "analysis"
BASE = {"accuracy", "config", "step", "limits", "progress", "tables", "chrome_trace"}
"""Modules at the top of ``analysis/`` that every feature shares."""
ALLOWED = {
    "base": {"base"},
    "sweeps": {"base", "sweeps"},
    "failures": {"base", "failures"},
    "validation": {"base", "validation"},
    "calibration": {"base", "calibration"},
    "traces": {"base", "traces", "calibration"},
    "reports": {"base", "reports", "sweeps"},
    "__init__": {"api"},
    "api": {"base", "sweeps", "api"},
    "cli": {"base", "sweeps", "failures", "validation", "calibration", "reports", "traces",
            "cli"},
}
"""Which parts of ``analysis`` each part may import."""


def _part(module: str) -> str:
    """``sweeps`` for ``clustersim.analysis.sweeps.ranking``, ``base`` for ``...analysis.step``."""
    name = module.split(".")[2]
    return "base" if name in BASE else name


def _analysis_imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "clustersim.analysis":
                yield from (f"clustersim.analysis.{a.name}" for a in node.names)
            elif node.module.startswith("clustersim.analysis."):
                yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("clustersim.analysis."))


def _own_part(path) -> str:
    rel = path.relative_to(ANALYSIS).parts
    return _part("clustersim.analysis." + (rel[0] if len(rel) > 1 else rel[0][:-3]))


def test_top_of_analysis_holds_only_the_shared_modules_and_the_api():
    flat = {p.stem for p in ANALYSIS.glob("*.py")} - {"__init__"}
    assert flat == BASE | {"api"}


@pytest.mark.parametrize("path", sorted(ANALYSIS.rglob("*.py")), ids=lambda p: str(p.relative_to(REPO)))
def test_analysis_parts_import_one_way(path):
    own = _own_part(path)
    wrong = sorted({m for m in _analysis_imports(path) if _part(m) not in ALLOWED[own]})
    assert not wrong, f"{path.relative_to(REPO)} ({own}) imports {wrong}"


def test_nothing_outside_the_command_line_imports_a_command():
    for path in project_python_files():
        rel = path.relative_to(REPO)
        if rel.parts[0] == "tests" or rel.parts[:2] == ("analysis", "cli"):
            continue
        commands = [m for m in _analysis_imports(path) if m.startswith("clustersim.analysis.cli")]
        assert commands in ([], ["clustersim.analysis.cli.main"]) and (
            not commands or rel.name == "__main__.py"), f"{rel} imports {commands}"
