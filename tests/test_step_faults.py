"""``faults:`` in a ``simulate`` config: a slow GPU, a degraded NIC or NVLink, a slow host on one
rank, the step time with and without them, and whose compute or waits grew."""

import json

import pytest
import yaml

from clustersim.analysis.config import config_from_mapping, load_config
from clustersim.analysis.step import run_faulted_step, step_faults
from clustersim.hardware_specs import SpecError

from tests.test_cli import clustersim
from tests.test_failures_cli import CONFIG

TINY = CONFIG[:CONFIG.index("failures:")].replace("tiny-failures", "tiny-straggler")
"""The failures test's 16-GPU job (TP2 PP2 DP4, 2 GPUs per node) without its failures."""


def _config(faults):
    data = yaml.safe_load(TINY)
    data["faults"] = faults
    return config_from_mapping(data)


def _check_straggler(config, rank, clock):
    """The slowed rank's compute grows by 1/clock; the step by at least what cannot hide in the
    healthy step; ranks that share no group with it keep their own compute."""
    faults = step_faults(config)
    report, step = run_faulted_step(config, faults, limit=False)
    healthy, faulted = step.healthy, step.faulted
    slow = next(c for c in faulted.classes if c.representative == rank and c.ranks == 1)
    before = next(c for c in healthy.classes if c.program == slow.program)
    assert slow.breakdown.compute_s == pytest.approx(before.breakdown.compute_s / clock,
                                                     rel=1e-3)
    exposed = slow.breakdown.compute_s + slow.breakdown.optimizer_s - healthy.step_time_s
    assert step.lost_s >= exposed - 1e-9
    assert step.lost_s > 0 and report.result is faulted
    for cls in faulted.classes:
        if cls is slow:
            continue
        same = next(c for c in healthy.classes if c.program == cls.program)
        assert cls.breakdown.compute_s == pytest.approx(same.breakdown.compute_s, rel=1e-3), cls
    first = step.grown[0]
    assert (first.part, first.group) == ("compute", f"rank {rank} itself")
    return step


def test_slow_gpu_costs_the_step_through_its_tp_and_dp_groups():
    step = _check_straggler(_config([{"rank": 5, "gpu_clock": 0.7}]), 5, 0.7)
    groups = {(g.part, g.group) for g in step.grown}
    assert ("tp", "the TP group of rank 5") in groups
    assert ("dp", "the DP group of rank 5") in groups


def test_degraded_nic_grows_only_network_waits_and_nvlink_only_scale_up_waits():
    # Ranks 0 and 1 share a node (2 GPUs per node): TP goes over NVLink, DP over the network.
    nic_cfg = _config([{"rank": 0, "nic_bandwidth": 0.25}])
    nic = run_faulted_step(nic_cfg, step_faults(nic_cfg))[1]
    nvl_cfg = _config([{"rank": 0, "nvlink_bandwidth": 0.25}])
    nvl = run_faulted_step(nvl_cfg, step_faults(nvl_cfg))[1]
    assert nic.lost_s > 0 and nvl.lost_s > 0
    nic_parts = {g.part for g in nic.grown}
    assert "dp" in nic_parts and not any(g.part == "compute" for g in nic.grown)
    assert "tp" in {g.part for g in nvl.grown}
    # The NIC carries no TP traffic: the TP group of rank 0 waits only behind the DP wait.
    assert not any(g.part == "tp" and g.group == "the TP group of rank 0" and g.grown_s >
                   0.5 * nic.lost_s for g in nic.grown)


def test_slow_host_launches_and_late_input_cost_the_step():
    launch_cfg = _config([{"rank": 3, "launch_overhead": "2 ms"}])
    launch = run_faulted_step(launch_cfg, step_faults(launch_cfg))[1]
    assert launch.lost_s > 0
    assert launch.grown[0].part == "compute" and launch.grown[0].group == "rank 3 itself"
    stall_cfg = _config([{"rank": 3, "data_loader_stall": "50 ms"}])
    stall = run_faulted_step(stall_cfg, step_faults(stall_cfg))[1]
    # The late input is waited for once per step by its rank; nobody can start without it.
    assert stall.lost_s == pytest.approx(0.05, rel=0.2)
    assert any(g.part == "other" and g.group == "rank 3 itself" and
               g.grown_s == pytest.approx(0.05, rel=1e-6) for g in stall.grown)


def test_no_faults_section_means_none():
    assert step_faults(config_from_mapping(yaml.safe_load(TINY))) is None


@pytest.mark.parametrize("faults, field, words", [
    ([{"rank": 99, "gpu_clock": 0.7}], "faults[0].rank", "<= 15"),
    ([{"rank": 1, "gpu_clock": 1.5}], "faults[0].gpu_clock", "<= 1"),
    ([{"rank": 1, "gpu_clock": 0}], "faults[0].gpu_clock", ">= 0.001"),
    ([{"rank": 1}], "faults[0].rank", "needs one of"),
    ([{"rank": 1, "gpu_clok": 0.7}], "faults[0].gpu_clok",
     "unknown field; did you mean gpu_clock?"),
    ([{"rank": 1, "gpu_clock": 0.7, "gpu_clok": 1}], "faults[0].gpu_clok", "unknown field"),
    ([{"rank": 1, "launch_overhead": "fast"}], "faults[0].launch_overhead", ""),
    ([{"rank": 1, "gpu_clock": 0.7}, {"rank": 1, "gpu_clock": 0.5}], "faults[1].gpu_clock",
     "already"),
    ({"rank": 1}, "faults", "a list"),
])
def test_bad_faults_are_errors_naming_the_field(faults, field, words):
    with pytest.raises(SpecError) as err:
        step_faults(_config(faults))
    assert err.value.field == field and words in str(err.value)


def test_cli_bad_fault_exits_2_naming_the_field(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(TINY + "faults: [{rank: 3, nic_bandwidth: 2}]\n")
    run = clustersim("simulate", str(cfg))
    assert run.returncode == 2 and "faults[0].nic_bandwidth" in run.stderr
    assert "Traceback" not in run.stderr


def test_cli_prints_and_writes_the_faulted_step(tmp_path):
    cfg, out = tmp_path / "tiny.yaml", tmp_path / "r.json"
    cfg.write_text(TINY + "faults: [{rank: 5, gpu_clock: 0.7}]\n")
    run = clustersim("simulate", str(cfg), "--json", str(out))
    assert run.returncode == 0, run.stderr
    assert "rank 5: GPU at 0.7x clock" in run.stdout and "the TP group of rank 5" in run.stdout
    data = json.loads(out.read_text())["faults"]
    assert data["step_time_s"] > data["healthy_step_time_s"]
    assert data["grown"][0]["group"] == "rank 5 itself"


@pytest.mark.slow
def test_gpt3_175b_on_1024_a100_with_one_gpu_at_0_7x_clock():
    """The issue's case: rank 17 of the 1,024-GPU GPT-3 example at 70% clock."""
    step = _check_straggler(load_config("examples/gpt3_175b_straggler.yaml"), 17, 0.7)
    groups = {(g.part, g.group) for g in step.grown}
    assert {("tp", "the TP group of rank 17"), ("dp", "the DP group of rank 17")} <= groups
    # Stage 0 of one pipeline runs 1/0.7 slower; the healthy step hid little of it (the critical
    # stage computes 82% of the step), so most of the extra compute shows in the step.
    own = step.grown[0].grown_s
    assert 0.8 * own < step.lost_s <= own
