"""What a first-time user types wrong, and the one line that tells them what to type instead."""

import pytest

from clustersim.analysis.cli import main
from clustersim.analysis.config import config_from_mapping
from clustersim.hardware_specs import SpecError
from clustersim.hardware_specs.fields import close_names

CONFIG = {"model": "llama3-8b", "training": {"seq_len": 8192, "global_batch": 64},
          "strategy": {"tp": 8, "pp": 1, "dp": 1}, "cluster": {"gpu": "h100-sxm", "num_gpus": 8}}


def _with(section: str, key: str, value) -> dict:
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in CONFIG.items()}
    if key:
        data[section][key] = value
    else:
        data[section] = value
    return data


@pytest.mark.parametrize("section, key, value, field, meant", [
    ("cluster", "gpu", "H100", "cluster.gpu", "h100-sxm"),
    ("cluster", "gpu", "H200", "cluster.gpu", "h200"),
    ("cluster", "gpu", "a100", "cluster.gpu", "a100-80gb"),
    ("model", "", "llama-3-8b", "model", "llama3-8b"),
    ("model", "", "Llama3-70B", "model", "llama3-70b"),
])
def test_a_near_miss_name_says_what_was_meant(section, key, value, field, meant):
    with pytest.raises(SpecError) as err:
        config_from_mapping(_with(section, key, value))
    assert err.value.field == field
    assert "did you mean" in err.value.message and meant in err.value.message.split("?")[0]


def test_a_name_that_differs_only_in_case_or_dashes_suggests_that_name_alone():
    assert close_names("H200", ["h200", "h800", "b200"]) == ["h200"]
    assert close_names("llama-3-8b", ["llama3-8b", "llama3-70b"]) == ["llama3-8b"]
    assert close_names("zzz", ["h200"]) == []


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_report_of_a_missing_folder_says_the_folder_is_missing(capsys, tmp_path):
    code, _, err = run(capsys, "report", str(tmp_path / "nowhere"), "--out", str(tmp_path / "r.html"))
    assert code == 2
    assert err.startswith(f"error: RUN_DIR: {tmp_path / 'nowhere'}: no such folder")
    assert "damaged" not in err


@pytest.mark.parametrize("key, values, field", [
    ("cluster.gpuu", "h100-sxm,h200", "did you mean gpu?"),
    ("clusterr.gpu", "h100-sxm,h200", "did you mean cluster?"),
    ("cluster.gpu", "h100-sxm,h2OO", "unknown device 'h2OO'"),
    ("cluster.node", "dgx-h100,dgx-h1OO", "dgx-h1OO"),
])
def test_a_typo_in_a_vary_key_or_value_is_one_error_line_before_anything_runs(capsys, key,
                                                                               values, field):
    code, out, err = run(capsys, "compare", "llama3_8b_fsdp", "--vary", f"{key}={values}")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"error: --vary: {key}: ") and field in err


def test_collective_and_validate_share_one_error_sign_prediction_over_measurement_in_time(capsys):
    from clustersim.analysis.accuracy import ERROR_MEANING
    from clustersim.analysis.validation.published import RowOutcome
    from tests.conftest import REPO

    code, out, _ = run(capsys, "collective", "--gpu", "h100-sxm", "--gpus", "8", "--against",
                       str(REPO / "examples/nccl_tests_h100_p5.log"))
    assert code == 0 and ERROR_MEANING in out
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0].isdigit()]
    assert len(rows) == 32
    for size, measured_us, predicted_us, _, _, error, _ in rows:
        expected = float(predicted_us) / float(measured_us) - 1
        assert float(error.rstrip("%")) == pytest.approx(100 * expected, abs=0.1), size
    assert RowOutcome("run", measured_s=2.0, predicted_s=2.2).error == pytest.approx(0.1)


def _write(tmp_path, data) -> str:
    import yaml
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


OOM = {"model": "llama3-8b", "training": {"seq_len": 4096, "global_batch": 1},
       "strategy": {"tp": 1, "pp": 1, "dp": 1}, "cluster": {"gpu": "h100-sxm", "num_gpus": 1}}


def test_a_step_that_does_not_fit_says_so_in_a_banner_and_exits_3_unless_allowed(capsys, tmp_path):
    config = _write(tmp_path, OOM)
    code, out, err = run(capsys, "simulate", config)
    assert code == 3
    assert out.startswith("!!!") and "DOES NOT FIT IN MEMORY: stage 0 needs up to" in out
    assert "of 80.0 GiB" in out.splitlines()[1]
    assert err.startswith("error: job does not fit in GPU memory")
    code, out, err = run(capsys, "simulate", config, "--allow-oom")
    assert code == 0 and "DOES NOT FIT IN MEMORY" in out and err == ""
    fits = _write(tmp_path, {**OOM, "cluster": {"gpu": "h200", "num_gpus": 1},
                             "strategy": {"tp": 1, "pp": 1, "dp": 1, "recompute": "full"}})
    code, out, _ = run(capsys, "simulate", fits)
    assert code == 0 and "DOES NOT FIT" not in out


def test_json_gives_peak_memory_in_gib_beside_the_decimal_stable_key(capsys, tmp_path):
    import json
    out_json = tmp_path / "step.json"
    code, out, _ = run(capsys, "simulate", _write(tmp_path, OOM), "--allow-oom", "--json", str(out_json))
    data = json.loads(out_json.read_text())
    gib = max(stage["required"] for stage in data["memory"]) / 2**30
    assert data["peak_memory_gib"] == pytest.approx(gib, rel=1e-12)
    assert data["peak_memory_gb"] == pytest.approx(gib * 2**30 / 1e9, rel=1e-12)
    assert f"peak memory     {gib:.1f} GiB per GPU" in out


SMALL = {"model": "llama3-8b", "training": {"seq_len": 4096, "global_batch": 8},
         "strategy": {"tp": 1, "pp": 1, "dp": 8, "zero": 3},
         "cluster": {"gpu": "h100-sxm", "num_gpus": 8}}


def test_tflops_say_they_are_model_flops_and_give_hardware_flops_when_recompute_adds_work(
        capsys, tmp_path):
    import json
    import re
    out_json = tmp_path / "step.json"
    full = {**SMALL, "strategy": {**SMALL["strategy"], "recompute": "full"}}
    code, out, _ = run(capsys, "simulate", _write(tmp_path, full), "--json", str(out_json))
    data = json.loads(out_json.read_text())
    model, hardware = re.search(r"([\d.]+) TFLOP/s per GPU of model FLOPs \(([\d.]+) counting "
                                r"recomputation", out).groups()
    assert float(model) == pytest.approx(data["tflops_per_gpu"], abs=0.05)
    ratio = data["hardware_flops_per_step"] / data["flops_per_step"]
    assert ratio > 1.2 and float(hardware) == pytest.approx(data["tflops_per_gpu"] * ratio, abs=0.06)
    code, out, _ = run(capsys, "simulate", _write(tmp_path, SMALL))
    assert "TFLOP/s per GPU of model FLOPs, MFU" in out


@pytest.mark.parametrize("attention, noted", [("flash", True), ("standard", False)])
def test_selective_recompute_says_when_it_changes_nothing(capsys, tmp_path, attention, noted):
    selective = {**SMALL, "training": {**SMALL["training"], "attention": attention},
                 "strategy": {**SMALL["strategy"], "recompute": "selective"}}
    code, out, _ = run(capsys, "simulate", _write(tmp_path, selective))
    assert code == 0
    assert ("recompute: selective changes nothing here" in out) is noted


@pytest.mark.parametrize("gpu, attention, noted", [
    ("b200", "flash", True), ("b200", "flash3", False), ("h100-sxm", "flash", False)])
def test_flash_attention_2_on_blackwell_is_called_a_placeholder(capsys, tmp_path, gpu,
                                                               attention, noted):
    """FlashAttention-2's rate on Blackwell is Hopper's figure: the summary says so and names
    the kernel class today's Blackwell stacks run."""
    job = {**SMALL, "training": {**SMALL["training"], "attention": attention},
           "cluster": {"gpu": gpu, "num_gpus": 8}}
    code, out, _ = run(capsys, "simulate", _write(tmp_path, job))
    assert code == 0
    assert ("attention: flash runs FlashAttention-2, unmeasured on Blackwell" in out) is noted
