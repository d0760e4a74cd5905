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


@pytest.mark.parametrize("key, field", [("cluster.gpuu", "did you mean gpu?"),
                                        ("clusterr.gpu", "did you mean cluster?")])
def test_a_typo_in_a_vary_key_is_one_error_line_before_anything_runs(capsys, key, field):
    code, out, err = run(capsys, "compare", "llama3_8b_fsdp", "--vary", f"{key}=h100-sxm,h200")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"error: --vary: {key}: ") and field in err
