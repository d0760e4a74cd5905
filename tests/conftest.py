"""Shared fixtures: the catalog, and small jobs that simulate in well under a second.

Tiers: ``pytest -m "not slow"`` is the fast tier (under a minute); ``pytest`` runs everything,
as CI does. Property tests draw a fixed set of examples (``ci`` profile, derandomized: a failure
reproduces on every run); ``HYPOTHESIS_PROFILE=thorough`` draws many more at random.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from clustersim.hardware_specs import load_catalog
from clustersim.workloads import Job, Strategy, TrainingSpec
from clustersim.workloads.model import from_mapping

REPO = Path(__file__).resolve().parents[1]
SOURCE_FOLDERS = ("hardware_specs", "workloads", "simulator", "analysis", "tests", "benchmarks",
                  "examples", "docs")


def project_python_files() -> list[Path]:
    """Every Python file of the project: the root's and its folders', never one of a virtual
    environment or a build that happens to sit in the checkout (CI's .ci-venv does)."""
    files = list(REPO.glob("*.py"))
    for folder in SOURCE_FOLDERS:
        files += (REPO / folder).rglob("*.py")
    return sorted(files)

settings.register_profile("ci", max_examples=10, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def catalog():
    return load_catalog()


def tiny_model(**over):
    """A small GPT-like model: 8 layers of h=1024, tiny vocabulary (embedding/head negligible)."""
    spec = {"name": "tiny", "layers": 8, "hidden": 1024, "heads": 16, "vocab": 256, "mlp": "gelu"}
    spec.update(over)
    return from_mapping(spec)


def tiny_job(strategy: Strategy, global_batch: int = 16, micro_batch: int = 1,
             seq_len: int = 1024, **model) -> Job:
    training = TrainingSpec(seq_len=seq_len, global_batch=global_batch, micro_batch=micro_batch)
    return Job(tiny_model(**model), training, strategy).checked(strategy.world_size)
