"""Strategy sweeps: the space, streaming and resuming, backends, and the ranking users read."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from clustersim.analysis.config import config_from_mapping
from clustersim.analysis.sweeps.run_store import CHECK, POINTS, RunStore
from clustersim.analysis.sweeps.space import Status, SweepSpace, enumerate_space, no_more_work, space_from_mapping
from clustersim.analysis.sweeps.runner import from_mapping, run_sweep
from clustersim.hardware_specs import SpecError
from clustersim.simulator import SimulationOptions, simulate
from tests.conftest import REPO
from clustersim.workloads.builder import build_trace
from clustersim.workloads.strategy import Offload, Recompute, Strategy

pytestmark = pytest.mark.slow  # whole sweeps run end to end (minutes in all)

TINY = {
    "name": "tiny",
    "model": {"name": "tiny", "layers": 8, "hidden": 1024, "heads": 16, "vocab": 256},
    "training": {"seq_len": 1024, "global_batch": 16},
    "strategy": {"tp": 2, "pp": 2, "dp": 2},
    "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
    "sweep": {"micro_batch": [1], "cp": [1]},
}


def write_config(tmp_path: Path, **over) -> Path:
    data = {**TINY, **over}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def clustersim(*args, **kw):
    return subprocess.run([sys.executable, "-m", "clustersim", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600, **kw)


def read_rows(out: Path) -> list[dict]:
    """Every line of points.csv as written (checksum column aside)."""
    with (out / POINTS).open(newline="") as fh:
        return [{k: v for k, v in r.items() if k != CHECK} for r in csv.DictReader(fh)]


# --- the space -----------------------------------------------------------------------------

def test_space_statuses_follow_check_strategy_and_memory():
    cfg = config_from_mapping(TINY)
    space = space_from_mapping(TINY["sweep"])
    cands = enumerate_space(cfg.job, 8, 2.5 * 2**30, space)
    assert len({c.key for c in cands}) == len(cands), "keys are unique"
    statuses = {c.status for c in cands}
    assert statuses == set(Status), statuses
    for c in cands:
        if c.status is Status.INVALID:
            with pytest.raises(SpecError):
                c.job.checked(8)
        else:
            c.job.checked(8)
            fits = c.peak_memory_bytes <= 2.5 * 2**30
            assert fits == (c.status is not Status.DOES_NOT_FIT), c.key
    # every divisor of 8 appears as a TP degree that was tried
    assert {c.job.strategy.tp for c in cands} == {1, 2, 4, 8}
    assert any(c.status is Status.SIMULATE and c.job.strategy.tp == 8 for c in cands)


def test_sweep_section_rejects_bad_values_with_the_field():
    with pytest.raises(SpecError, match=r"sweep.recompute\[1\]: expected one of"):
        space_from_mapping({"recompute": ["none", "some"]})
    with pytest.raises(SpecError, match="sweep.tpp: unknown field"):
        space_from_mapping({"tpp": [1]})
    with pytest.raises(SpecError, match="sweep.zero: expected at least one value"):
        space_from_mapping({"zero": []})


def test_dominance_order():
    base = Strategy(dp=8, zero=1)
    heavier = Strategy(dp=8, zero=2, recompute=Recompute.FULL, offload=Offload.OPTIMIZER)
    assert no_more_work(base, heavier) and not no_more_work(heavier, base)
    assert not no_more_work(Strategy(dp=8, zero=1), Strategy(dp=8, zero=3))
    assert not no_more_work(Strategy(dp=8, zero=0), Strategy(dp=8, zero=1))
    # one data-parallel rank: ZeRO has nothing to shard, every stage is the same work
    assert no_more_work(Strategy(tp=8, zero=3), Strategy(tp=8, zero=0))
    assert not no_more_work(Strategy(tp=4, cp=2, zero=3), Strategy(tp=4, cp=2, zero=0))


def test_zero_stages_without_a_group_to_shard_over_simulate_once(catalog):
    """dp x cp = 1: ZeRO 1-3 build the very step ZeRO 0 builds (same step time, to the bit), so
    the sweep lists them as dominated by ZeRO 0 and simulates one."""
    cfg = config_from_mapping(TINY)
    cands = enumerate_space(cfg.job, 8, cfg.cluster.device.memory_bytes,
                            SweepSpace(micro_batch=(1,), cp=(1,), recompute=(Recompute.NONE,),
                                       offload=(Offload.NONE,)))
    single = [c for c in cands if c.job.strategy.dp == 1 and c.status is not Status.INVALID]
    assert {c.job.strategy.zero for c in single if c.status is Status.SIMULATE} == {0}
    assert sum(c.status is Status.DOMINATED for c in single) >= 12
    for c in single:
        if c.status is Status.DOMINATED:
            winner = next(w for w in cands if w.key == c.reason.split(" ")[0])
            assert winner.job.strategy.zero == 0
            steps = [simulate(build_trace(x.job), cfg.cluster,
                              SimulationOptions(record=False)).step_time_s for x in (c, winner)]
            assert steps[0] == steps[1], c.key


def test_no_dominated_strategy_is_faster_than_its_dominator(catalog):
    """The claim that lets a sweep skip dominated points, checked by simulating all of them."""
    cfg = config_from_mapping(TINY)
    cands = enumerate_space(cfg.job, 8, cfg.cluster.device.memory_bytes,
                            SweepSpace(micro_batch=(1,), cp=(1,)))
    by_key = {c.key: c for c in cands}
    dominated = [c for c in cands if c.status is Status.DOMINATED]
    assert len(dominated) > 50
    times = {}

    def step(c):
        if c.key not in times:
            times[c.key] = simulate(build_trace(c.job), cfg.cluster,
                                    SimulationOptions(record=False)).step_time_s
        return times[c.key]

    for c in dominated:
        winner = by_key[c.reason.split(" ")[0]]
        assert winner.status is Status.SIMULATE
        assert step(c) >= step(winner) * (1 - 1e-12), (c.key, winner.key)


# --- streaming, resuming, backends ---------------------------------------------------------

def test_sweep_streams_points_and_a_rerun_recomputes_nothing(tmp_path):
    cfg = write_config(tmp_path)
    out = tmp_path / "run"
    first = clustersim("sweep", str(cfg), "--out", str(out), "--workers", "1")
    assert first.returncode == 0, first.stderr
    rows = read_rows(out)
    assert rows and len({r["key"] for r in rows}) == len(rows)
    assert "simulated" in first.stdout and "#" in first.stdout
    again = clustersim("sweep", str(cfg), "--out", str(out), "--workers", "1")
    assert again.returncode == 0, again.stderr
    assert f"{len(rows)} reused from" in again.stdout and ", 0 now" in again.stdout
    assert read_rows(out) == rows


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_killed_sweep_resumes_without_losing_or_recomputing_a_point(tmp_path, sig):
    cfg = write_config(tmp_path, sweep={"micro_batch": [1], "cp": [1, 2],
                                        "prune_dominated": False})
    out = tmp_path / "run"
    # Ctrl-C as a terminal delivers it: a test runner started in the background (``cmd &``)
    # passes SIGINT on ignored, and Python then keeps ignoring it, so restore its default.
    proc = subprocess.Popen([sys.executable, "-m", "clustersim", "sweep", str(cfg), "--out",
                             str(out), "--workers", "2"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    points = out / POINTS
    deadline = time.time() + 120
    while time.time() < deadline:
        if points.exists() and points.read_text().count("\n") > 20:
            break
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == (130 if sig is signal.SIGINT else -signal.SIGKILL), err
    before = {r["key"]: r for r in RunStore(out).read_points().values()}
    assert len(before) >= 20
    done = clustersim("sweep", str(cfg), "--out", str(out), "--workers", "2")
    assert done.returncode == 0, done.stderr
    assert f"{len(before)} reused from" in done.stdout
    after = read_rows(out)
    keys = [r["key"] for r in after]
    assert len(keys) == len(set(keys)), "no point simulated twice"
    by_key = {r["key"]: r for r in after}
    assert all(by_key[k] == row for k, row in before.items()), "finished points kept as they were"
    assert len(after) > len(before)


def test_torn_last_line_is_dropped_and_that_point_simulated_again(tmp_path):
    loaded = from_mapping(TINY)
    out = tmp_path / "run"
    run_sweep(loaded, out)
    complete = read_rows(out)
    text = (out / POINTS).read_text()
    torn = text[: text.rstrip("\n").rfind("\n") + 1] + "12,tp1-pp1"
    (out / POINTS).write_text(torn)
    from clustersim.analysis.sweeps.ranking import ranking
    assert len(ranking(out)) == len(complete) - 1, "readers skip the torn line"
    assert (out / POINTS).read_text() == torn, "and leave the file alone (a sweep may append)"
    outcome = run_sweep(loaded, out)
    assert outcome.simulated == 1
    assert sorted(read_rows(out), key=lambda r: r["key"]) == sorted(complete,
                                                                    key=lambda r: r["key"])


def test_damaged_and_repeated_lines_are_dropped_and_the_resumed_ranking_is_unchanged(
        tmp_path, capsys):
    from clustersim.analysis.sweeps.ranking import ranking
    loaded = from_mapping(TINY)
    run_sweep(loaded, tmp_path / "clean")
    expected = ranking(tmp_path / "clean")
    out = tmp_path / "run"
    run_sweep(loaded, out)
    lines = (out / POINTS).read_text().splitlines(keepends=True)
    damaged = lines[1].replace(",", ",9", 1)               # a changed value: checksum mismatch
    lines = [lines[0], damaged, *lines[2:], lines[2], "x" * 200_000 + "\n", "garbage,\"1"]
    (out / POINTS).write_text("".join(lines))
    mid = ranking(out)
    assert len(mid) == len(expected) - 1 and mid["key"].is_unique, "never ranked twice"
    outcome = run_sweep(loaded, out)
    assert outcome.simulated == 1, "only the damaged point runs again"
    assert "dropped 4 line(s)" in capsys.readouterr().err
    again = ranking(out)
    assert again.reset_index(drop=True).equals(expected.reset_index(drop=True))
    assert len(read_rows(out)) == len(expected), "the file holds each point once"


def test_a_points_file_without_a_header_starts_over(tmp_path):
    loaded = from_mapping(TINY)
    out = tmp_path / "run"
    run_sweep(loaded, out)
    n = len(read_rows(out))
    (out / POINTS).write_text("\x00\x01 not csv\n")
    assert RunStore(out).read_points() == {}
    assert run_sweep(loaded, out).simulated == n


def test_folder_of_another_config_is_refused(tmp_path):
    out = tmp_path / "run"
    assert clustersim("sweep", str(write_config(tmp_path)), "--out", str(out),
                      "--workers", "1").returncode == 0
    other = write_config(tmp_path, training={"seq_len": 2048, "global_batch": 16})
    run = clustersim("sweep", str(other), "--out", str(out), "--workers", "1")
    assert run.returncode == 2
    assert run.stderr.startswith("error: --out:") and "another config_hash" in run.stderr


def _sorted_points(out: Path) -> list[dict]:
    return sorted(read_rows(out), key=lambda r: r["key"])


def test_same_points_whatever_the_backend_and_worker_count(tmp_path):
    loaded = from_mapping(TINY)
    run_sweep(loaded, tmp_path / "one", workers=1)
    run_sweep(loaded, tmp_path / "two", workers=2)
    assert _sorted_points(tmp_path / "one") == _sorted_points(tmp_path / "two")
    distributed = pytest.importorskip("dask.distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        run_sweep(loaded, tmp_path / "dask", dask_address=cluster.scheduler_address)
    assert _sorted_points(tmp_path / "one") == _sorted_points(tmp_path / "dask")


def test_unreachable_dask_scheduler_is_a_clear_error(tmp_path):
    pytest.importorskip("dask.distributed")
    run = clustersim("sweep", str(write_config(tmp_path)), "--out", str(tmp_path / "r"),
                     "--dask", "tcp://127.0.0.1:9")
    assert run.returncode == 2 and "error: --dask: cannot reach" in run.stderr


# --- what users read -----------------------------------------------------------------------

def test_python_api_returns_dataframes(tmp_path):
    from clustersim.analysis import simulate as simulate_df, sweep
    one = simulate_df(TINY)
    assert len(one) == 1
    for key in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "peak_memory_gb",
                "fits_in_memory", "compute_s", "bubble_s", "tp", "pp", "dp"):
        assert key in one.columns
    ranked = sweep(TINY, tmp_path / "run")
    assert list(ranked["rank"]) == list(range(1, len(ranked) + 1))
    assert ranked["tokens_per_s"].is_monotonic_decreasing
    assert (ranked["memory_headroom_gib"] > 0).all()
    assert ranked.iloc[0]["tokens_per_s"] >= one.iloc[0]["tokens_per_s"]


def test_tensor_parallelism_inside_a_node_beats_tensor_parallelism_across_nodes(tmp_path):
    """Practice (Narayanan et al. SC'21 sec. 3.2, takeaway #1): keep TP within the NVLink
    domain. Llama-3-70B on 64 H100: TP8 (one node) against TP16 (two nodes)."""
    data = yaml.safe_load((REPO / "examples/llama3_70b_h100.yaml").read_text())
    data["sweep"] = {"tp": [8, 16], "pp": [4], "cp": [1], "micro_batch": [1],
                     "schedule": ["1f1b"], "recompute": ["selective"], "zero": [1],
                     "offload": ["none"]}
    data["training"] = {**data["training"], "global_batch": 32}
    ranked = from_mapping(data)
    run_sweep(ranked, tmp_path / "run")
    from clustersim.analysis.sweeps.ranking import ranking
    frame = ranking(tmp_path / "run")
    assert list(frame["tp"]) == [8, 16]
    assert frame.iloc[0]["tokens_per_s"] > frame.iloc[1]["tokens_per_s"]


def test_progress_in_a_file_is_lines_not_a_bar_and_no_progress_is_silent(tmp_path):
    cfg = write_config(tmp_path)
    quiet = clustersim("sweep", str(cfg), "--out", str(tmp_path / "a"), "--workers", "1",
                       "--no-progress")
    assert "sweep:" not in quiet.stderr and "%|" not in quiet.stderr
    shown = clustersim("sweep", str(cfg), "--out", str(tmp_path / "b"), "--workers", "1")
    assert "%|" not in shown.stderr      # a quick sweep: no bar, and no line either


def test_a_sweep_keeps_the_configs_overlaps_where_a_candidate_can_have_them():
    data = {**TINY, "strategy": {**TINY["strategy"], "sequence_parallel": True, "zero": 1,
                                 "tp_comm_overlap": True, "overlap_param_gather": True},
            "sweep": {**TINY["sweep"], "sequence_parallel": [True, False], "zero": [0, 1]}}
    cfg = config_from_mapping(data)
    cands = enumerate_space(cfg.job, 8, 80 * 2**30, space_from_mapping(data["sweep"]))
    for c in cands:
        s = c.job.strategy
        assert s.tp_comm_overlap == s.sequence_parallel
        assert s.overlap_param_gather == (s.zero == 1)
    assert not any("overlap" in c.reason for c in cands)
    assert any(c.status is Status.SIMULATE and c.job.strategy.tp_comm_overlap for c in cands)


# --- work order ----------------------------------------------------------------------------

def test_workers_take_the_longest_points_first_and_one_worker_the_cheapest():
    """Several workers start on the points with the most layer passes (longest processing time
    first), so the longest does not come last on one worker; one worker goes cheapest first, so
    an interrupted sweep has as many points as it could."""
    from clustersim.analysis.limits import layer_passes
    from clustersim.analysis.sweeps.runner import work_order
    cfg = config_from_mapping(TINY)
    space = space_from_mapping({"micro_batch": [1, 2, 4], "cp": [1]})
    todo = [c for c in enumerate_space(cfg.job, 8, 80 * 2**30, space) if c.status is Status.SIMULATE]
    costs = {layer_passes(c.job) for c in todo}
    assert len(costs) >= 3
    parallel = [layer_passes(c.job) for c in work_order(todo, parallel=True)]
    serial = [layer_passes(c.job) for c in work_order(todo, parallel=False)]
    assert parallel == sorted(parallel, reverse=True) and parallel[0] == max(costs)
    assert serial == sorted(serial) and serial[0] == min(costs)
    assert sorted(c.key for c in work_order(todo, True)) == sorted(c.key for c in todo)
