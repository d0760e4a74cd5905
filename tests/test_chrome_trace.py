"""The --trace output must load in Perfetto / chrome://tracing (Trace Event Format, JSON object)."""

import json

import pytest

from clustersim.analysis.chrome_trace import chrome_trace, write_chrome_trace
from clustersim.analysis.config import load_config
from clustersim.analysis.step import run_step

from tests.conftest import REPO


@pytest.fixture(scope="module")
def gpt3_result():
    return run_step(load_config(REPO / "examples/gpt3_175b_a100.yaml")).result


@pytest.mark.slow
def test_trace_follows_the_trace_event_format(gpt3_result, tmp_path):
    path = tmp_path / "t.json"
    write_chrome_trace(gpt3_result, path)
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    meta = [e for e in events if e["ph"] == "M"]
    assert len(complete) == len(gpt3_result.records) > 0
    for e in complete:
        assert isinstance(e["name"], str) and e["name"]
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert e["ts"] >= 0 and e["dur"] >= 0
    names = {(e["pid"], e["name"]) for e in meta}
    for c in gpt3_result.classes:
        assert (c.index, "process_name") in names and (c.index, "thread_name") in names
    last_end = max(e["ts"] + e["dur"] for e in complete)
    assert last_end == pytest.approx(gpt3_result.step_time_s * 1e6, rel=1e-9)


@pytest.mark.slow
def test_every_simulated_class_has_compute_and_communication_tracks(gpt3_result):
    events = chrome_trace(gpt3_result)["traceEvents"]
    threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "X"}
    for c in gpt3_result.classes:
        assert (c.index, 0) in threads          # compute
        assert (c.index, 1) in threads          # tp
        assert (c.index, 4) in threads          # pp
