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


@pytest.mark.slow
def test_only_streams_that_ran_something_get_a_named_track(gpt3_result):
    events = chrome_trace(gpt3_result)["traceEvents"]
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    used = {(e["pid"], e["tid"]) for e in events if e["ph"] == "X"}
    assert named == used
    assert {e["args"]["name"] for e in events if e["name"] == "thread_name"} == {
        "compute", "TP communication", "PP send/recv", "DP communication"}


@pytest.mark.slow
def test_pipeline_receives_are_drawn_from_when_their_data_could_arrive(gpt3_result):
    """Receives are posted as soon as their deps are done (often at time 0); drawn from then
    they would cover the whole step. From the matching send's posting, a stage's receives
    take about as long as its sends: transfers of the same activations."""
    events = [e for e in chrome_trace(gpt3_result)["traceEvents"] if e["ph"] == "X"
              and e["cat"] == "pp"]
    for c in gpt3_result.classes:
        recv = sum(e["dur"] for e in events if e["pid"] == c.index and e["name"].startswith("recv"))
        assert recv < 0.05 * gpt3_result.step_time_s * 1e6, (c.program, recv)


@pytest.mark.slow
def test_events_carry_flops_or_bytes_and_group():
    from clustersim.analysis.config import load_config
    from clustersim.analysis.step import run_step
    report = run_step(load_config("llama3_8b_fsdp"))
    events = [e for e in chrome_trace(report.result, report.trace)["traceEvents"]
              if e["ph"] == "X"]
    compute = [e for e in events if e["tid"] == 0 and e["cat"] != "optimizer"]
    assert compute and all(e["args"]["hbm_mb"] > 0 for e in compute)
    assert all(e["args"]["gflop"] > 0 for e in compute if ".attn" in e["name"] or ".mlp" in e["name"])
    gathers = [e for e in events if e["cat"] == "dp"]
    assert gathers and all(e["args"]["group"] == "dp" and e["args"]["group_size"] == 8
                           and e["args"]["bytes"] > 0 for e in gathers)
    total = sum(e["args"]["gflop"] for e in compute) * 1e9
    assert total >= report.trace.model_flops / 8 * 0.99   # recompute adds, never removes
