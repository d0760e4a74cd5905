"""End to end through the command line: what a user types and reads."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def clustersim(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "clustersim", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_simulate_default_example_prints_summary_and_memory_table(tmp_path):
    out = tmp_path / "r.json"
    run = clustersim("simulate", "--json", str(out))
    assert run.returncode == 0, run.stderr
    assert "llama3-70b (70.55B parameters)" in run.stdout
    assert "Memory per GPU" in run.stdout and "stage" in run.stdout
    data = json.loads(out.read_text())
    for key in ("parameters", "flops_per_step", "peak_memory_gb", "fits_in_memory", "memory",
                "step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "breakdown"):
        assert key in data
    assert [s["stage"] for s in data["memory"]] == [0, 1]
    for part in ("weights", "gradients", "optimizer", "activations", "comm_buffers", "reserve"):
        assert data["memory"][0][part] > 0
    b = data["breakdown"]
    total = (b["compute_s"] + sum(b["exposed_comm_s"].values()) + b["bubble_s"]
             + b["optimizer_s"] + b["other_s"])
    assert total == pytest.approx(data["step_time_s"], rel=1e-9)


@pytest.mark.parametrize("strategy, message", [
    ("{tp: 7, pp: 1, dp: 1}", "error: strategy.tp: 7 does not divide model.heads=64"),
    ("{tp: 8, pp: 2, dp: 2}", "error: strategy: dp*tp*pp*cp = 2*8*2*1 = 32 but cluster.num_gpus = 64"),
    ("{tp: 8, pp: 2, dp: 4, tpp: 3}", "error: strategy.tpp: unknown field; did you mean tp?"),
])
@pytest.mark.slow
def test_bad_config_exits_2_with_the_field_and_numbers(tmp_path, strategy, message):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(f"model: llama3-70b\ntraining: {{seq_len: 8192, global_batch: 512}}\n"
                   f"strategy: {strategy}\ncluster: {{gpu: h100-sxm, num_gpus: 64}}\n")
    run = clustersim("simulate", str(cfg))
    assert run.returncode == 2
    assert run.stderr.startswith(message)
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("args, message", [
    (["--min-bytes", "0"], "error: --min-bytes: expected at least 1 byte, got 0"),
    (["--min-bytes", "1G", "--max-bytes", "1M"], "error: --max-bytes: expected at least --min-bytes"),
    (["--step-factor", "1"], "error: --step-factor: expected a factor above 1, got 1"),
    (["--step-factor", "1.0000001"], "gives more than 10000 sizes"),
])
@pytest.mark.slow
def test_collective_size_range_errors_instead_of_looping(args, message):
    run = clustersim("collective", "--gpu", "h100-sxm", "--gpus", "8", *args)
    assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr


EXAMPLE = (REPO / "examples/llama3_8b_fsdp.yaml").read_text()


def _write(directory, name: str, content: str | bytes):
    path = directory / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


BAD_INPUTS = {
    "a directory": (lambda d: d, ["simulate"], "expected a file, got a directory"),
    "not UTF-8": (lambda d: _write(d, "b.yaml", b"\xff\xfe"), ["simulate"],
                  "is not a UTF-8 text file"),
    "NaN seed": (lambda d: _write(d, "c.yaml", EXAMPLE + "failures: {seed: .nan}\n"),
                 ["failures", "--days", "1"], "failures.seed: expected an integer, got nan"),
    "bad stage entry": (lambda d: _write(d, "c.yaml", EXAMPLE.replace(
                            "strategy: {", "strategy: {pp: 2, layers_per_stage: [abc, 16], ")),
                        ["simulate"],
                        "strategy.layers_per_stage[0]: expected an integer, got 'abc'"),
    "costs typo": (lambda d: _write(d, "c.yaml", EXAMPLE + "costs: {gpu_hourr: 2}\n"),
                   ["simulate"], "costs.gpu_hourr: unknown field; did you mean gpu_hour?"),
    "fractional HF layers": (
        lambda d: _write(d, "h.json", '{"num_hidden_layers": 2.9, "hidden_size": 64, '
                                      '"num_attention_heads": 4, "vocab_size": 100}')
        and _write(d, "c.yaml", EXAMPLE.replace("model: llama3-8b", "model: h.json")),
        ["simulate"], "model (h.json: num_hidden_layers): expected a whole number, got 2.9"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", BAD_INPUTS)
def test_unreadable_or_non_finite_input_exits_2_naming_it(tmp_path, case):
    make, args, message = BAD_INPUTS[case]
    run = clustersim(*args, str(make(tmp_path)))
    assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr, \
        run.stderr


@pytest.mark.slow
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_an_unwritable_output_exits_2_after_printing_the_result():
    run = clustersim("simulate", "examples/llama3_8b_fsdp.yaml", "--json", "/dev/full")
    assert run.returncode == 2 and "step time" in run.stdout
    assert "error: No space left on device" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.slow
def test_validate_rejects_a_measured_time_of_zero_and_exits_2(tmp_path):
    rows = (REPO / "analysis/data/published_runs_dev.csv").read_text().splitlines()[:2]
    header = rows[0].split(",")
    cells = next(__import__("csv").reader([rows[1]]))
    cells[header.index("measured_step_time_s")] = "0"
    path = tmp_path / "runs.csv"
    path.write_text(rows[0] + "\n" + ",".join(f'"{c}"' for c in cells) + "\n")
    run = clustersim("validate", "--runs", str(path))
    assert run.returncode == 2
    assert "measured_step_time_s: expected a positive number of seconds, got '0'" in run.stdout
    assert "no run could be compared" in run.stderr


@pytest.mark.slow
def test_unknown_gpu_suggests_catalog_names(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("model: llama3-8b\ntraining: {seq_len: 2048, global_batch: 8}\n"
                   "cluster: {gpu: h100, num_gpus: 1}\n")
    run = clustersim("simulate", str(cfg))
    assert run.returncode == 2 and "cluster.gpu: unknown device 'h100'" in run.stderr


@pytest.mark.slow
def test_hardware_list_and_show():
    listed = clustersim("hardware", "list")
    assert listed.returncode == 0 and "h100-sxm" in listed.stdout and "dgx-h100" in listed.stdout
    shown = clustersim("hardware", "show", "dgx-h100", "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["devices_per_node"] == 8
