"""A plain (not editable) install is the one namespace ``clustersim`` and works from any folder."""

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_a_plain_install_is_one_namespace_that_runs_anywhere(tmp_path):
    source, target = tmp_path / "source", tmp_path / "site"   # pip builds in the source tree
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".ci-venv", "build", "*.egg-info", "__pycache__", "runs", "out"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                    str(target), str(source)], check=True, capture_output=True)
    ours = {p.name for p in target.iterdir() if not p.name.endswith((".dist-info", ".egg-info"))}
    assert ours - {"bin", "__pycache__"} == {"clustersim"}
    assert (target / "clustersim" / "examples" / "llama3_70b_h100.yaml").exists()
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = ("import clustersim; row = clustersim.simulate('llama3_70b_h100'); "
            "print(clustersim.__file__); print(round(float(row['step_time_s'][0]), 3))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    assert out[0].startswith(str(target))
    assert float(out[1]) > 0
    cli = subprocess.run([sys.executable, "-m", "clustersim", "simulate"], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    assert "step time" in cli.stdout
