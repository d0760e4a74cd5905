"""Golden outputs: every example's numbers, and the README's, stay what they were.

A golden (``tests/golden/<example>.json``) is the summary of the command the README shows for
that example; the test reruns the command and compares within ``TOLERANCE`` (1e-6 relative: the
simulation is deterministic). A change that moves a number on purpose regenerates them with
``python -m tests.golden.regenerate`` and shows every moved number in its diff.
"""

from __future__ import annotations

import pytest

from tests.golden.examples import EXAMPLES, REPO, RUNS, TOLERANCE, differences
from tests.golden.readme import MARKER, README, goldens, rendered, stale
from tests.golden.calibration import CALIBRATION_RUNS
from tests.golden.sweep import SWEEPS
from tests.golden.traces import TRACE_REPLAYS
from tests.golden.validation import VALIDATIONS

REGENERATE = "python -m tests.golden.regenerate"


def test_every_example_has_a_golden():
    shipped = {p.name for p in EXAMPLES.iterdir() if p.suffix in (".yaml", ".log")}
    assert {run.example for run in RUNS} == shipped
    assert all(run.path.exists() for run in RUNS), f"missing goldens: run {REGENERATE}"


@pytest.mark.parametrize("run", [pytest.param(r, id=r.name, marks=[pytest.mark.slow] * r.slow)
                                 for r in RUNS])
def test_example_matches_its_golden(run):
    moved = differences(run.stored(), run.run())
    assert not moved, (f"clustersim {' '.join(run.args)} moved beyond {TOLERANCE:g} relative "
                       f"(if on purpose: {REGENERATE} {run.name}):\n  " + "\n  ".join(moved))


def test_readme_numbers_are_the_goldens():
    text = README.read_text()
    assert len(MARKER.findall(text)) >= 20
    out_of_date = stale(text, goldens())
    assert not out_of_date, (f"README numbers differ from the goldens (run {REGENERATE} "
                             f"--readme):\n  " + "\n  ".join(out_of_date))


def test_a_stale_readme_number_is_caught_and_rewritten():
    stored = goldens()
    text = ("steps of <!--golden moe_fabric_contention.step_time_s .3f-->6.84<!--/golden--> s, "
            "<!--golden derived.moe_ep_ratio .1f-->9.9<!--/golden-->x")
    step = stored["moe_fabric_contention"]["step_time_s"]
    assert stale(text, stored)[0].startswith("moe_fabric_contention.step_time_s: README says "
                                             "'6.84'")
    fixed = rendered(text, stored)
    assert f"-->{step:.3f}<!--" in fixed and stale(fixed, stored) == []


def test_a_marker_naming_no_golden_is_an_error():
    with pytest.raises(KeyError, match="no golden named 'nonexistent'"):
        stale("<!--golden nonexistent.step_time_s .1f-->1<!--/golden-->", goldens())
    with pytest.raises(KeyError, match="has no 'step_s' there"):
        stale("<!--golden llama3_70b_h100.step_s .1f-->1<!--/golden-->", goldens())


@pytest.mark.parametrize("golden", [
    *CALIBRATION_RUNS, *(pytest.param(g, marks=pytest.mark.slow) for g in TRACE_REPLAYS)],
    ids=lambda g: g.name)
def test_measured_runs_predicted_again_give_their_golden(golden):
    """The README's calibration and trace tables: committed measurements against today's
    predictions."""
    moved = differences(golden.stored(), golden.run())
    assert not moved, f"(if on purpose: {REGENERATE} {golden.name}):\n  " + "\n  ".join(moved)


def test_a_stale_readme_table_is_caught_and_rewritten():
    stored = goldens()
    text = "<!--golden-table calibration_amd_epyc_2_cores.table-->\n| old |\n<!--/golden-table-->"
    assert stale(text, stored) == ["table calibration_amd_epyc_2_cores.table: README's differs "
                                   "from the goldens"]
    fixed = rendered(text, stored)
    assert "| dp2 | 390 ms |" in fixed and stale(fixed, stored) == []


@pytest.mark.slow
@pytest.mark.parametrize("golden", VALIDATIONS, ids=lambda g: g.name)
def test_sampled_published_runs_give_their_golden_errors(golden):
    """The accuracy tables' goldens are current: a spread sample of each file's rows replays
    to the stored errors (the whole file takes minutes; regenerating replays it all)."""
    stored = golden.stored()["rows"]
    replayed = golden.run_sample()
    assert set(replayed) == set(golden.sample_ids())
    errors = {i: r["error"] for i, r in replayed.items()}
    moved = differences({i: stored[i]["error"] for i in replayed}, errors)
    memory = {i: r["peak_memory_error"] for i, r in replayed.items()
              if r["peak_memory_error"] is not None}
    moved += differences({i: stored[i].get("peak_memory_error") for i in memory}, memory)
    assert not moved, (f"clustersim {' '.join(golden.args)} moved (if on purpose: "
                       f"{REGENERATE} {golden.name}):\n  " + "\n  ".join(moved))


def test_every_published_runs_file_has_a_validation_golden():
    tables = {p.name for p in (REPO / "analysis" / "data").glob("published_runs_*.csv")
              if "measured_step_time_s" in p.read_text().partition("\n")[0]}
    assert {g.runs for g in VALIDATIONS} == tables   # the CNN table is checked on its own
    assert all(g.path.exists() for g in VALIDATIONS), f"missing goldens: run {REGENERATE}"


@pytest.mark.slow
@pytest.mark.parametrize("golden", SWEEPS, ids=lambda g: g.name)
def test_the_readme_sweep_golden_is_current(golden):
    """Its enumeration counts again (cheap), and its fastest ranked points
    simulated again one by one (the whole sweep takes minutes)."""
    stored = golden.stored()
    assert golden.counts() == stored["counts"]
    assert stored["simulated"] == stored["counts"]["simulate"] == len(stored["points"])
    replayed = golden.run_sample(stored["points"])
    expected = {p["key"]: p["tokens_per_s"] for p in stored["points"] if p["key"] in replayed}
    moved = differences(expected, replayed)
    assert not moved, (f"clustersim {' '.join(golden.args)} moved (if on purpose: "
                       f"{REGENERATE} {golden.name}):\n  " + "\n  ".join(moved))
