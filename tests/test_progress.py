"""Long commands show how far they got on stderr even when stderr is a file (a sweep was silent
for 21 minutes in a log, validate for 4), and never write progress to stdout."""

import io

import yaml

from clustersim.analysis.cli import main
from clustersim.analysis.progress import LineProgress, NoProgress, progress
from tests.conftest import REPO


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_lines_come_every_few_seconds_with_the_count_and_the_time_left():
    stream, clock = io.StringIO(), Clock()
    bar = LineProgress(10, "sweep", "point", stream, every_s=10.0, clock=clock)
    for _ in range(4):
        clock.now += 3.0
        bar.update()
    bar.close()
    lines = stream.getvalue().splitlines()
    assert lines == ["sweep: 4/10 points (40%), 12 s, about 18 s left",
                     "sweep: 4/10 points (40%), 12 s, about 18 s left"]


def test_a_run_shorter_than_the_interval_prints_nothing():
    stream, clock = io.StringIO(), Clock()
    bar = LineProgress(3, "validate", "run", stream, every_s=10.0, clock=clock)
    for _ in range(3):
        clock.now += 1.0
        bar.update()
    bar.close()
    assert stream.getvalue() == ""


def test_a_file_gets_lines_a_terminal_a_bar_and_no_progress_gets_nothing():
    assert isinstance(progress(5, "sweep", "point", None, io.StringIO()), LineProgress)
    assert isinstance(progress(5, "sweep", "point", False, io.StringIO()), NoProgress)


def test_sweep_and_validate_report_progress_on_stderr_when_it_is_not_a_terminal(
        capsys, tmp_path, monkeypatch):
    import clustersim.analysis.progress as progress_module
    monkeypatch.setattr(progress_module, "LINE_EVERY_S", 0.0)
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({
        "model": {"name": "tiny", "layers": 2, "hidden": 256, "heads": 4, "vocab": 128},
        "training": {"seq_len": 256, "global_batch": 2},
        "strategy": {"tp": 1, "pp": 1, "dp": 2}, "cluster": {"gpu": "h100-sxm", "num_gpus": 2},
        "sweep": {"tp": [1], "pp": [1], "schedule": ["1f1b"], "recompute": ["none"],
                  "zero": [0], "offload": ["none"]}}))
    assert main(["sweep", str(config), "--out", str(tmp_path / "run"), "--workers", "1"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines()[-1].startswith("sweep: 1/1 points (100%)") and "sweep:" not in out
    import csv
    rows = list(csv.DictReader((REPO / "analysis/data/published_runs_dev.csv").open()))[:2]
    for row in rows:
        row["measured_step_time_s"] = "0"      # not mapped: no simulation, still counted
    table = tmp_path / "runs.csv"
    with table.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert main(["validate", "--runs", str(table)]) == 2
    out, err = capsys.readouterr()
    assert "validate: 2/2 runs (100%)" in err and "validate:" not in out
