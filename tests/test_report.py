"""The HTML report (and its Markdown twin) of a sweep, checked as files and in a real browser."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from clustersim.analysis.reports.plots import pareto_front
from clustersim.analysis.reports.sweep_report import build_report
from clustersim.analysis.sweeps.runner import from_mapping, run_sweep
from tests.test_sweep import TINY

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    run = root / "run"
    run_sweep(from_mapping({**TINY, "costs": {"gpu_hour": 2.0}}), run)
    (run / "failures.json").write_text(json.dumps({
        "goodput": 0.91, "interruptions": 12,
        "policies": [{"policy": "sync", "goodput": 0.88}, {"policy": "async", "goodput": 0.93}]}))
    files = build_report(run, root / "out" / "report.html")
    return root / "out" / "report.html", files


@pytest.mark.slow
def test_report_is_self_contained_with_a_markdown_twin_and_figure_files(report):
    html_path, files = report
    html = html_path.read_text()
    for section in ("Summary", "Ranking", "Step-time breakdown", "memory per stage",
                    "step timeline", "Throughput against memory", "Energy and cost per token",
                    "Failure study", "Pareto front strategy", "Failure waste is about"):
        assert section in html, section
    assert "pipeline timeline" not in html, "the best strategy has no pipeline (PP=1)"
    assert "Calibration" not in html, "no calibration.json in the folder, no section"
    assert "USD/Mtok" in html
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(images) == 5
    for data in images:
        assert base64.b64decode(data).startswith(b"\x89PNG")
    assert not re.search(r'(src|href)="(?!data:)', html), "nothing loaded from outside the file"
    md = html_path.with_suffix(".md").read_text()
    assert "| # | strategy |" in md and "](report_figures/breakdown.png)" in md
    names = {p.name for p in files}
    for fig in ("breakdown", "memory_per_stage", "step_timeline", "pareto", "cost_energy"):
        assert {f"{fig}.png", f"{fig}.svg"} <= names
        assert (html_path.parent / "report_figures" / f"{fig}.svg").read_text().lstrip().startswith("<?xml")


@pytest.mark.slow
def test_every_pareto_front_point_is_numbered_and_listed(report):
    import pandas as pd
    from clustersim.analysis.sweeps.ranking import folder_config, ranking
    run = report[0].parent.parent / "run"
    frame = ranking(run, folder_config(run))
    front = pareto_front(list(zip(frame["peak_memory_gib"], frame["tokens_per_s"])))
    md = report[0].with_suffix(".md").read_text()
    table = md.split("| # | Pareto front strategy |")[1].split("\n\n")[0]
    listed = [line for line in table.splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(listed) == len(front) > 0
    assert isinstance(frame, pd.DataFrame)


@pytest.mark.slow
def test_a_pipelined_best_strategy_gets_a_pipeline_timeline_with_readable_tracks(tmp_path):
    run = tmp_path / "run"
    run_sweep(from_mapping({**TINY, "sweep": {**TINY["sweep"], "pp": [2], "tp": [2]}}), run)
    files = build_report(run, tmp_path / "r.html")
    html = files[0].read_text()
    assert "pipeline timeline" in html and "step timeline" not in html
    svg = (tmp_path / "r_figures" / "pipeline_timeline.svg").read_text()
    assert "stage1 x4: PP send/recv" in svg and "class 0" not in svg


def test_energy_chart_keeps_long_strategy_names_inside_and_promises_no_cost_without_prices():
    from clustersim.analysis.reports.plots import cost_and_energy
    labels = [f"TP{t} PP16 DP{d} mb1 interleavedx2 rc:selective ZeRO-1 offload:optimizer"
              for t, d in ((1, 64), (2, 32), (4, 16), (8, 8))]
    fig = cost_and_energy(labels, [1.0, 2.0, 3.0, 4.0], None, "")
    fig.canvas.draw()
    box = fig.bbox
    ticks = fig.axes[0].get_yticklabels()
    assert len(ticks) == 4
    for t in ticks:
        extent = t.get_window_extent()
        assert extent.x0 >= box.x0 - 1 and extent.x1 <= box.x1 + 1, t.get_text()
    assert fig._suptitle.get_text() == "Energy per token"
    priced = cost_and_energy(labels, [1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], "USD")
    assert priced._suptitle.get_text() == "Energy and cost per token"


def test_failure_waste_note_says_why_a_constant_column_is_constant():
    import pandas as pd
    from clustersim.analysis.reports.sweep_report import failure_waste_note
    assert "for every strategy" in failure_waste_note(pd.DataFrame({"failure_waste": [6e-4] * 3}))
    assert "ranges from" in failure_waste_note(pd.DataFrame({"failure_waste": [1e-3, 5e-3]}))


def test_the_report_goes_beside_the_results_folder_by_default(tmp_path, monkeypatch):
    from clustersim.analysis.cli.report import default_out
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "llama70b").mkdir(parents=True)
    assert default_out("runs/llama70b") == Path("runs/llama70b_report.html")
    assert default_out("runs/llama70b/") == Path("runs/llama70b_report.html")
    monkeypatch.chdir(tmp_path / "runs" / "llama70b")
    assert default_out(".") == Path("../llama70b_report.html")


def test_pareto_front_keeps_only_points_nothing_beats():
    points = [(10, 5), (20, 9), (15, 4), (30, 9), (40, 12), (12, 7)]
    assert pareto_front(points) == [0, 5, 1, 4]


def _browser_available() -> bool:
    return Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()


@pytest.mark.skipif(not _browser_available() and not os.environ.get("CI"),
                    reason="Debian's chromium and chromium-driver are not installed")
def test_report_loads_in_headless_chromium_with_images_and_no_console_errors(report, tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(options=options, service=service)
    try:
        driver.get(report[0].resolve().as_uri())
        assert driver.execute_script("return document.readyState") == "complete"
        assert "clustersim sweep" in driver.title
        widths = driver.execute_script(
            "return Array.from(document.images).map(i => i.complete ? i.naturalWidth : 0)")
        assert len(widths) == 5 and all(w > 0 for w in widths), widths
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == []
    finally:
        driver.quit()


@pytest.mark.slow
def test_report_of_a_folder_that_is_not_a_sweep_exits_2(tmp_path):
    from tests.test_sweep import clustersim
    run = clustersim("report", str(tmp_path), "--out", str(tmp_path / "r.html"))
    assert run.returncode == 2
    assert run.stderr.startswith("error: RUN_DIR:") and "is not a sweep folder" in run.stderr
