"""Imports point one way: analysis -> simulator -> workloads -> hardware_specs."""

import ast

import pytest

from tests.conftest import REPO

LAYERS = ["hardware_specs", "workloads", "simulator", "analysis"]


def _imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module.split(".")[0]


@pytest.mark.parametrize("package", LAYERS)
def test_packages_import_only_the_layers_below_them(package):
    allowed = set(LAYERS[: LAYERS.index(package) + 1])
    for path in sorted((REPO / package).rglob("*.py")):
        wrong = {m for m in _imports(path) if m in LAYERS and m not in allowed}
        assert not wrong, f"{path.relative_to(REPO)} imports {sorted(wrong)}"


def test_the_packages_come_from_this_checkout():
    import analysis
    import hardware_specs
    import simulator
    import workloads
    for module in (analysis, hardware_specs, simulator, workloads):
        assert REPO in __import__("pathlib").Path(module.__file__).resolve().parents
