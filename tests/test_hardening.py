"""Bad input that used to end in a Python traceback now ends in one line naming the field
(exit status 2), whatever the input."""

import pickle
import subprocess
import sys

import pytest
import simpy

from clustersim.hardware_specs import SpecError
from clustersim.hardware_specs.errors import shown
from clustersim.hardware_specs.fields import Fields
from clustersim.hardware_specs.textfile import load_json, load_yaml


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "clustersim", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def _simulate_8_gpus(tmp_path, gpu: str, training: str):
    """``clustersim simulate`` of Llama-3-8B on 8 GPUs of ``gpu`` with ``training``."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"model: llama3-8b\ntraining: {{seq_len: 2048, micro_batch: 1, {training}}}\n"
                   f"strategy: {{tp: 1, pp: 1, dp: 8}}\ncluster: {{gpu: {gpu}, num_gpus: 8}}\n")
    return _cli("simulate", str(cfg), cwd=tmp_path)


def test_a_spec_error_raised_inside_a_simpy_process_reaches_the_user_as_itself():
    env = simpy.Environment()

    def process(env):
        yield env.timeout(1)
        raise SpecError("training.precision", "fp8 needs a device with FP8 units")

    env.process(process(env))
    with pytest.raises(SpecError) as err:
        env.run()
    assert err.value.field == "training.precision"
    assert str(err.value) == "training.precision: fp8 needs a device with FP8 units"
    again = pickle.loads(pickle.dumps(err.value))
    assert (again.field, again.message) == (err.value.field, err.value.message)


@pytest.mark.slow
def test_fp8_on_an_a100_is_a_one_line_error(tmp_path):
    proc = _simulate_8_gpus(tmp_path, "a100-80gb", "global_batch: 16, precision: fp8")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: ") and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("text", ["² steps", "٣ steps"])
def test_unicode_digits_in_an_interval_are_an_error_naming_the_field(text):
    from clustersim.analysis.failures.config import _interval
    with pytest.raises(SpecError, match="checkpoint.interval: expected young, daly"):
        _interval(Fields({"interval": text}, "checkpoint"))
    assert _interval(Fields({"interval": "100 steps"}, "checkpoint"))[2] == 100


def test_unicode_digits_in_a_log_size_are_not_a_row():
    from clustersim.analysis.validation.nccl_tests_log import _row
    assert _row("² 1 float sum -1 10.0 1.0 1.0 0 10.0 1.0 1.0 0".split()) is None


def test_huge_integers_are_refused_before_they_overflow():
    with pytest.raises(SpecError, match="hidden: expected an integer of at most 2\\*\\*53"):
        Fields({"hidden": 1e308}).integer("hidden")
    assert Fields({"layers": 2**53}).integer("layers") == 2**53


def test_an_error_never_spells_out_an_unbounded_value():
    bomb = ["lol"] * 9
    for _ in range(9):
        bomb = [bomb] * 9          # 9**10 leaves, as a YAML alias bomb builds
    assert len(shown(bomb)) < 200
    assert len(shown("x" * 10**6)) < 100
    with pytest.raises(SpecError) as err:
        Fields({"hidden": bomb}).integer("hidden")
    assert len(str(err.value)) < 300


def test_deep_or_huge_numbers_in_yaml_and_json_are_one_line_errors(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(SpecError, match="nested too deeply"):
        load_json(deep, "model")
    digits = tmp_path / "digits.yaml"
    digits.write_text("hidden: " + "9" * 5000 + "\n")
    with pytest.raises(SpecError, match="cannot be read"):
        load_yaml(digits, "config")
    broken = tmp_path / "broken.json"
    broken.write_text('{"hidden": ')
    with pytest.raises(SpecError, match="not valid JSON"):
        load_json(broken, "model")


@pytest.mark.parametrize("section, expected", [
    ({"distribution": "fixed", "value": 1e308}, "slowdown.value: expected 1 to 1000"),
    ({"distribution": "lognormal", "median": 2, "sigma": 1e308}, "slowdown.sigma: expected a number <= 5"),
])
def test_straggler_slowdowns_are_bounded_by_name(section, expected):
    from clustersim.hardware_specs.failures import MAX_SLOWDOWN, read_distribution
    from clustersim.hardware_specs.units import Quantity
    with pytest.raises(SpecError, match=expected):
        read_distribution(Fields(section, "slowdown"), Quantity.COUNT, 1.0, MAX_SLOWDOWN)


def test_oversubscription_is_bounded_by_name(catalog):
    from clustersim.analysis.config import config_from_mapping
    raw = {"model": "llama3-8b", "training": {"seq_len": 2048, "global_batch": 16},
           "strategy": {"dp": 8}, "cluster": {"gpu": "h100-sxm", "num_gpus": 8,
                                              "oversubscription": 1e308}}
    with pytest.raises(SpecError, match="cluster.oversubscription: expected a number <= 64"):
        config_from_mapping(raw)


@pytest.mark.slow
def test_a_step_over_the_work_budget_says_so_before_it_starts(tmp_path):
    proc = _simulate_8_gpus(tmp_path, "h100-sxm", "global_batch: 1048576")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "layer passes" in proc.stderr and "--no-limit" in proc.stderr
    assert "4,194,304" in proc.stderr          # 131,072 micro-batches x 32 layers


def test_the_work_budget_counts_what_the_engine_replays():
    from clustersim.analysis.limits import LAYER_PASS_BUDGET, layer_passes
    from clustersim.workloads import Strategy
    from tests.conftest import tiny_job
    job = tiny_job(Strategy(dp=2, pp=2), global_batch=16)       # 8 micro-batches, 8 layers
    assert layer_passes(job) == 8 * 8
    assert layer_passes(job, per_rank=True) == 8 * 8 * 2
    assert layer_passes(tiny_job(Strategy(dp=4, zero=3))) == 4 * 8 * 2
    assert layer_passes(tiny_job(Strategy(dp=4, zero=3))) < LAYER_PASS_BUDGET


@pytest.mark.slow
def test_a_collective_over_the_work_budget_says_so_at_once(tmp_path):
    proc = _cli("collective", "--gpu", "h100-sxm", "--gpus", "10000000", cwd=tmp_path)
    assert proc.returncode == 2 and "GPUs x sizes is 310,000,000" in proc.stderr


def test_a_layer_type_that_is_not_text_is_an_error_naming_it(tmp_path):
    import json

    from clustersim.workloads.model_sources import from_hf_config
    from tests.conftest import REPO
    cfg = json.loads((REPO / "workloads" / "hf_configs" / "gpt-oss-20b.json").read_text())
    cfg["layer_types"][3] = {"a": 1}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="layer_types.*unknown layer type {'a': 1}"):
        from_hf_config(tmp_path / "config.json")


def test_a_csv_record_past_the_field_limit_is_one_line(tmp_path):
    from clustersim.hardware_specs.textfile import read_csv_rows
    path = tmp_path / "runs.csv"
    path.write_text("id,source\na," + "x" * 140_000 + "\n")
    with pytest.raises(SpecError, match="--runs: .*not valid CSV"):
        read_csv_rows(path, "--runs")


def test_a_hundred_million_experts_are_refused_at_once():
    from clustersim.workloads.model import MAX_EXPERTS, from_mapping
    spec = {"name": "m", "layers": 2, "hidden": 256, "heads": 4, "vocab": 512, "mlp": "swiglu",
            "ffn_hidden": 512, "top_k": 2}
    with pytest.raises(SpecError, match="num_experts: expected an integer <= 16,384"):
        from_mapping({**spec, "num_experts": 100_000_000})
    assert from_mapping({**spec, "num_experts": MAX_EXPERTS}).num_experts == MAX_EXPERTS


def test_integers_too_large_for_a_float_are_refused_by_name():
    with pytest.raises(SpecError, match="n_routed_experts: expected an integer of at most 2\\*\\*53"):
        Fields({"n_routed_experts": 10**400}).integer("n_routed_experts")
    with pytest.raises(SpecError, match="ratio: expected a finite number"):
        Fields({"ratio": 10**400}).number("ratio")


@pytest.mark.parametrize("change, expected", [
    ({"interleave_moe_layer_step": 0}, "interleave_moe_layer_step.*expected 1 or more"),
    ({"no_rope_layers": 4}, "no_rope_layers.*expected a list"),
])
def test_bad_llama4_layer_patterns_are_errors_naming_the_key(tmp_path, change, expected):
    import json

    from clustersim.workloads.model_sources import from_hf_config
    from tests.conftest import REPO
    cfg = json.loads((REPO / "workloads" / "hf_configs" / "llama4-scout.json").read_text())
    target = cfg.get("text_config", cfg)
    target.update(change)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match=expected):
        from_hf_config(tmp_path / "config.json")


@pytest.mark.parametrize("key, value", [
    ("tie_word_embeddings", "false"), ("attention_bias", "no"), ("mlp_bias", 1),
])
def test_a_switch_of_a_hf_config_that_is_not_true_or_false_names_the_key(tmp_path, key, value):
    """Was: read as Python truth, so ``"tie_word_embeddings": "false"`` tied the embeddings."""
    import json
    from tests.conftest import REPO
    cfg = json.loads((REPO / "workloads" / "hf_configs" / "qwen3-30b-a3b.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, key: value}))
    (tmp_path / "c.yaml").write_text(
        f"model: {tmp_path / 'config.json'}\ntraining: {{seq_len: 2048, global_batch: 16}}\n"
        "strategy: {dp: 8}\ncluster: {gpu: h100-sxm, num_gpus: 8}\n")
    import contextlib
    import io

    from clustersim.analysis.cli.main import main
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert main(["simulate", str(tmp_path / "c.yaml")]) == 2
    assert err.getvalue() == (f"error: model (config.json: {key}): expected true or false, "
                              f"got {value!r}\n")


def test_a_step_without_steady_state_is_its_own_shortest_probe():
    """A sweep point whose full step has no steady state (PP2, two micro-batches: each stage's
    warm-up runs every forward) used to end ``clustersim sweep`` in a TypeError; the fuzz tier
    found it."""
    from clustersim.analysis.sweeps.steady_state import _warmups, first_count
    from clustersim.workloads import Strategy
    from tests.conftest import tiny_job
    job = tiny_job(Strategy(pp=2), global_batch=2)
    assert _warmups(job, job.micro_batches) is None
    assert first_count(job, 1) == job.micro_batches == 2


def test_a_node_that_holds_another_gpu_is_an_error_naming_the_node(catalog):
    """A p4d instance holds A100s: asking for H100s in it used to run an H100 over p4d's EFA
    with A100's memory banner mixed in, a machine nobody can rent."""
    with pytest.raises(SpecError) as err:
        catalog.cluster(device="h100-sxm", num_devices=16, node="aws-p4d-24xlarge")
    assert err.value.field == "cluster.node"
    assert "aws-p4d-24xlarge holds a100-40gb, not h100-sxm" in str(err.value)
    assert "aws-p5-48xlarge" in str(err.value)   # a node that does hold it
    ok = catalog.cluster(device="a100-40gb", num_devices=16, node="aws-p4d-24xlarge")
    assert ok.node.name == "aws-p4d-24xlarge"
