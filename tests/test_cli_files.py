"""Every command that reads a file says, in one line naming the file (exit 2, no traceback),
when the file is missing, a directory, empty or not what the command reads."""

import contextlib
import io

import pytest

from clustersim.analysis.cli.main import main

from tests.conftest import REPO

EXAMPLE = str(REPO / "examples" / "llama3_8b_fsdp.yaml")

COMMANDS = [
    ["simulate", "{f}"],
    ["sweep", "{f}", "--out", "{tmp}/run"],
    ["compare", "{f}"],
    ["plan", "{f}"],
    ["failures", "{f}"],
    ["trace", "export", "{f}", "--out", "{tmp}/chakra"],
    ["collective", "--cluster", "{f}", "--gpus", "8"],
    ["validate", "--runs", "{f}"],
    ["hardware", "list", "--catalog", "{f}"],
    ["simulate", EXAMPLE, "--catalog", "{f}"],
    ["collective", "--gpu", "h100-sxm", "--gpus", "8", "--against", "{f}"],
    ["trace", "import", "{f}", "--out", "{tmp}/trace.json"],
    ["report", "{f}"],
]


def _run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
    return code, err.getvalue()


def _argv(command: list[str], path, tmp_path) -> list[str]:
    return [a.replace("{f}", str(path)).replace("{tmp}", str(tmp_path)) for a in command]


def _one_error_line(code: int, stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2, stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize("kind", ["missing", "directory", "empty"])
def test_a_file_that_cannot_be_used_is_one_line_naming_it(tmp_path, command, kind):
    target = {"missing": tmp_path / "nosuch.yaml", "directory": tmp_path / "folder",
              "empty": tmp_path / "empty.yaml"}[kind]
    if kind == "directory":
        target.mkdir()
    if kind == "empty":
        target.write_text("")
    line = _one_error_line(*_run(_argv(command, target, tmp_path)))
    assert target.name in line
    assert "a value cannot be read" not in line       # a missing file used to be reported so


def test_a_missing_config_is_a_plain_message(tmp_path):
    missing = tmp_path / "nosuch.yaml"
    assert _one_error_line(*_run(["simulate", str(missing)])) == \
        f"error: cannot read {missing}: no such file"


@pytest.mark.parametrize("command, text, expected", [
    (["collective", "--gpus", "8", "--cluster"], "cluster: h100\n",
     "error: cluster: expected a mapping, got str 'h100'"),
    (["collective", "--gpus", "8", "--cluster"], "cluster: 5\n",
     "error: cluster: expected a mapping, got int 5"),
    (["hardware", "list", "--catalog"], "",
     "error: f.yaml: expected a mapping of catalog sections (devices, nodes, fabrics, "
     "memory_tiers, failure_models, prices), got an empty file"),
    (["hardware", "list", "--catalog"], "- 1\n",
     "error: f.yaml: expected a mapping of catalog sections (devices, nodes, fabrics, "
     "memory_tiers, failure_models, prices), got [1]"),
])
def test_a_file_of_the_wrong_shape_is_an_error_naming_the_section(tmp_path, command, text,
                                                                 expected):
    """collective's cluster file; a catalog file that defines nothing."""
    path = tmp_path / "f.yaml"
    path.write_text(text)
    assert _one_error_line(*_run([*command, str(path)])) == expected


@pytest.mark.parametrize("flags, expected", [
    (["--gpu", "nosuch"], "error: --gpu: unknown device 'nosuch'"),
    (["--gpu", "h100-sxm", "--gpus-per-node", "-1"], "error: --gpus-per-node: expected >= 1"),
    (["--gpu", "h100-sxm", "--gpus-per-node", "3"], "error: --gpus: 8 is not a whole number of"),
])
def test_collective_errors_name_the_flag_not_the_config_field(flags, expected):
    line = _one_error_line(*_run(["collective", "--gpus", "8", *flags]))
    assert line.startswith(expected)


def test_a_catalog_directory_without_catalog_files_is_an_error(tmp_path):
    line = _one_error_line(*_run(["hardware", "list", "--catalog", str(tmp_path)]))
    assert line == f"error: --catalog: {tmp_path} holds no catalog files (*.yaml, *.yml)"


@pytest.mark.parametrize("value", ["[]", "{a: 1}", "true"])
def test_a_config_name_must_be_text(tmp_path, value):
    path = tmp_path / "c.yaml"
    path.write_text(f"name: {value}\nmodel: llama3-8b\ntraining: {{seq_len: 2048, global_batch: 16}}\n"
                    "strategy: {dp: 8}\ncluster: {gpu: h100-sxm, num_gpus: 8}\n")
    assert _one_error_line(*_run(["plan", str(path)])).startswith("error: name: expected text")


@pytest.mark.parametrize("command", [
    ["simulate", "{f}"], ["failures", "{f}", "--days", "1", "--seeds", "1", "--workers", "1"],
    ["sweep", "{f}", "--out", "{tmp}/run", "--workers", "1"], ["plan", "{f}"],
    ["trace", "export", "{f}", "--out", "{tmp}/chakra"],
], ids=lambda c: c[0])
@pytest.mark.parametrize("section, expected", [
    ("faults: x", "error: faults: expected a list of faults"),
    ("faults: [{kind: nic}]", "error: faults[0].kind: unknown field (expected one of: "),
    ("costs: {gpu_hours: 2}", "error: costs.gpu_hours: unknown field"),
    ("sweep: {tp: [0]}", "error: sweep.tp[0]: expected an integer >= 1, got 0"),
    ("failures: {day: 3}", "error: failures.day: unknown field"),
])
def test_every_command_checks_every_section_of_a_config(tmp_path, command, section, expected):
    """Not only the command that uses a section: a typo in ``costs`` fails ``failures`` too."""
    path = tmp_path / "c.yaml"
    path.write_text("model: llama3-8b\ntraining: {seq_len: 2048, global_batch: 16}\n"
                    f"strategy: {{dp: 8}}\ncluster: {{gpu: h100-sxm, num_gpus: 8}}\n{section}\n")
    assert _one_error_line(*_run(_argv(command, path, tmp_path))).startswith(expected)


@pytest.mark.parametrize("text, expected", [
    ('{"x": 1}', "malformed trace JSON: missing key 'world_size'"),
    ("[1, 2]", "expected a JSON object with world_size, programs and group_sets, got list"),
])
def test_a_trace_file_that_is_not_a_trace_says_what_it_lacks(tmp_path, text, expected):
    path = tmp_path / "t.json"
    path.write_text(text)
    line = _one_error_line(*_run(["trace", "export", str(path), "--out", str(tmp_path / "c")]))
    assert line == f"error: trace: {path}: {expected}"


def _dev_runs(tmp_path, edit) -> str:
    import csv
    rows = list(csv.DictReader((REPO / "analysis/data/published_runs_dev.csv").open()))[:2]
    header, rows = edit(list(rows[0]), rows)
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows([[row.get(k, "") for k in header][:n] for row, n in rows])
    return str(path)


@pytest.mark.parametrize("edit, expected", [
    (lambda h, rows: ([c for c in h if c != "num_gpus"], [(r, 99) for r in rows]),
     "lacks the num_gpus column"),
    (lambda h, rows: (h, [(r, 99) for r in (rows[0], rows[0])]),
     "line 3: id 'narayanan-1p7b' is already the run of line 2"),
    (lambda h, rows: (h, [(rows[0], 99), (rows[1], 5)]), "line 3 has 5 cells; the header has"),
], ids=["missing column", "duplicate id", "short row"])
def test_a_runs_table_that_is_wrong_as_a_whole_is_one_line(tmp_path, edit, expected):
    """Said once for the table, before any run is simulated, not as a note under every row."""
    line = _one_error_line(*_run(["validate", "--runs", _dev_runs(tmp_path, edit)]))
    assert line.startswith("error: --runs: ") and expected in line, line


@pytest.mark.parametrize("key, value, expected", [
    ("device", "h999", "nodes.my-node.device: unknown device 'h999'"),
    ("host_memory", "ddr9", "nodes.my-node.host_memory: unknown memory tier 'ddr9'"),
    ("local_storage", "dgx-h100-nvmee", "nodes.my-node.local_storage: unknown memory tier "
                                        "'dgx-h100-nvmee'; did you mean dgx-h100-nvme"),
])
@pytest.mark.parametrize("command", [["hardware", "list"], ["simulate", EXAMPLE]],
                         ids=["hardware", "simulate"])
def test_a_catalog_entry_naming_an_unknown_entry_is_an_error_at_that_entry(
        tmp_path, command, key, value, expected):
    """Was: accepted by ``hardware list``, then ``cluster.gpu: unknown device`` (a field the
    config never set) once a config used the node."""
    import yaml
    node = yaml.safe_load((REPO / "hardware_specs/catalog/nodes_cloud.yaml").read_text())[
        "nodes"]["aws-p5-48xlarge"]
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({"nodes": {"my-node": {**node,
                                                                              key: value}}}))
    line = _one_error_line(*_run([*command, "--catalog", str(tmp_path)]))
    assert line.startswith(f"error: mine.yaml: {expected}"), line


SHARED = ("cluster: {gpu: a100-80gb, num_gpus: 16}\njobs:\n"
          "  - {name: a, gpus: 8, model: llama3-8b, strategy: {dp: 8},\n"
          "     training: {seq_len: 2048, global_batch: 8}}\n"
          "  - {name: b, gpus: 8, model: llama3-8b, strategy: {dp: 8},\n"
          "     training: {seq_len: 2048, global_batch: 8}}\n")


@pytest.mark.parametrize("command", [
    ["sweep", "{f}", "--out", "{tmp}/run"], ["plan", "{f}"], ["failures", "{f}"],
    ["trace", "export", "{f}", "--out", "{tmp}/chakra"],
], ids=lambda c: c[0])
def test_a_config_of_several_jobs_given_to_a_one_job_command_says_so(tmp_path, command):
    """Was: ``jobs: unknown field``, as if the user had misspelt a section."""
    path = tmp_path / "shared.yaml"
    path.write_text(SHARED)
    line = _one_error_line(*_run(_argv(command, path, tmp_path)))
    assert line.startswith("error: jobs: a config of several jobs sharing one cluster is read "
                           "by `clustersim simulate` and `clustersim compare` only"), line


@pytest.mark.parametrize("old, new, expected", [
    ("name: b,", "name: [b],", "error: jobs[1].name: expected text, got ['b']"),
    ("cluster:", "name: {a: 1}\ncluster:", "error: name: expected text, got {'a': 1}"),
])
def test_the_names_of_a_shared_config_must_be_text(tmp_path, old, new, expected):
    path = tmp_path / "shared.yaml"
    path.write_text(SHARED.replace(old, new, 1))
    assert _one_error_line(*_run(["simulate", str(path)])).startswith(expected)


@pytest.mark.parametrize("command, flag", [
    (["simulate", EXAMPLE, "--json"], "--json"), (["simulate", EXAMPLE, "--trace"], "--trace"),
    (["plan", EXAMPLE, "--json"], "--json"),
    (["failures", EXAMPLE, "--events-csv"], "--events-csv"),
    (["validate", "--runs", str(REPO / "analysis/data/published_runs_dev.csv"), "--json"],
     "--json"),
    (["collective", "--gpu", "h100-sxm", "--gpus", "8", "--json"], "--json"),
    (["trace", "import", EXAMPLE, "--out"], "--out"),
    (["calibrate", "validate", "--profile", EXAMPLE, "--report"], "--report"),
], ids=lambda c: c if isinstance(c, str) else " ".join(c[:2]))
@pytest.mark.parametrize("where, expected", [
    ("nosuch/out.json", "its folder {tmp}/nosuch does not exist"),
    ("file.txt/out.json", "its folder {tmp}/file.txt is not a folder"),
    (".", "expected a file to write, got the folder {tmp}/."),
])
def test_an_output_file_that_cannot_be_written_is_refused_before_any_work(
        tmp_path, command, flag, where, expected):
    """Was: the whole computation (minutes for failures or validate), then the error, the
    JSON or CSV lost."""
    (tmp_path / "file.txt").write_text("")
    err = io.StringIO()
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        with pytest.raises(SystemExit) as exit_:
            main([*command, f"{tmp_path}/{where}"])
    assert exit_.value.code == 2 and out.getvalue() == ""
    assert f"error: argument {flag}: " in err.getvalue()
    assert expected.format(tmp=tmp_path) in err.getvalue(), err.getvalue()


def test_mxfp8_on_a_device_without_block_scaled_fp8_is_an_error(tmp_path):
    """Was: an H100 ran MXFP8 at its FP8 rate (Transformer Engine refuses MXFP8 below compute
    capability 10.0). Blackwell, which has an mxfp8 rate, reads the same config."""
    import yaml

    from clustersim.analysis.config import config_from_mapping
    text = ("model: llama3-8b\ntraining: {seq_len: 2048, global_batch: 16, precision: fp8, "
            "fp8_recipe: mxfp8}\nstrategy: {dp: 8, zero: 3}\ncluster: {gpu: GPU, num_gpus: 8}\n")
    path = tmp_path / "c.yaml"
    path.write_text(text.replace("GPU", "h100-sxm"))
    line = _one_error_line(*_run(["plan", str(path)]))
    assert line.startswith("error: training.fp8_recipe: mxfp8 needs block-scaled FP8 tensor "
                           "cores; h100-sxm has no mxfp8 rate"), line
    config_from_mapping(yaml.safe_load(text.replace("GPU", "b200")))
    mixed = text.replace("{gpu: GPU, num_gpus: 8}", "{groups: [{gpu: b200, num_gpus: 8}, "
                                                     "{gpu: h100-sxm, num_gpus: 8}]}")
    path.write_text(mixed.replace("dp: 8", "dp: 16"))
    line = _one_error_line(*_run(["plan", str(path)]))
    assert line.startswith("error: training.fp8_recipe: mxfp8 needs block-scaled FP8 tensor "
                           "cores; h100-sxm has no mxfp8 rate"), line
