"""One installed namespace, and imports that point one way:
analysis -> simulator -> workloads -> hardware_specs."""

import ast
import tomllib
from pathlib import Path

import pytest

from tests.conftest import REPO, project_python_files

LAYERS = ["hardware_specs", "workloads", "simulator", "analysis"]


def _imports(path):
    """The clustersim layer each absolute import names (``clustersim.workloads.x`` -> workloads;
    a bare ``workloads`` import would be a second, uninstalled namespace and is reported as is)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module] if isinstance(node, ast.ImportFrom) and node.module
                 and node.level == 0 else [])
        for name in names:
            parts = name.split(".")
            yield parts[1] if parts[0] == "clustersim" and len(parts) > 1 else parts[0]


@pytest.mark.parametrize("package", LAYERS)
def test_packages_import_only_the_layers_below_them(package):
    allowed = set(LAYERS[: LAYERS.index(package) + 1])
    for path in sorted((REPO / package).rglob("*.py")):
        wrong = {m for m in _imports(path) if m in LAYERS and m not in allowed}
        assert not wrong, f"{path.relative_to(REPO)} imports {sorted(wrong)}"


@pytest.mark.slow
def test_code_imports_the_installed_namespace_only():
    for path in project_python_files():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert node.module.split(".")[0] not in LAYERS, \
                    f"{path.relative_to(REPO)}: 'from {node.module}' (write clustersim.{node.module})"


def test_every_package_folder_is_installed():
    """pyproject lists the packages by hand (the root maps to ``clustersim``); a new folder
    missing from it would be left out of a plain ``pip install``."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"clustersim"} | {
        "clustersim." + ".".join(p.parent.relative_to(REPO).parts)
        for layer in LAYERS for p in (REPO / layer).rglob("__init__.py")}
    assert found == listed


def test_the_packages_come_from_this_checkout():
    import clustersim
    import clustersim.analysis
    import clustersim.hardware_specs
    import clustersim.simulator
    import clustersim.workloads
    for module in (clustersim, clustersim.analysis, clustersim.hardware_specs,
                   clustersim.simulator, clustersim.workloads):
        assert REPO in Path(module.__file__).resolve().parents or \
            Path(module.__file__).resolve().parent == REPO
