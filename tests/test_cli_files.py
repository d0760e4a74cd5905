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
    argv = [a.replace("{f}", str(target)).replace("{tmp}", str(tmp_path)) for a in command]
    line = _one_error_line(*_run(argv))
    assert target.name in line
    assert "a value cannot be read" not in line       # a missing file used to be reported so


def test_a_missing_config_is_a_plain_message(tmp_path):
    missing = tmp_path / "nosuch.yaml"
    assert _one_error_line(*_run(["simulate", str(missing)])) == \
        f"error: cannot read {missing}: no such file"


def test_a_catalog_directory_without_catalog_files_is_an_error(tmp_path):
    line = _one_error_line(*_run(["hardware", "list", "--catalog", str(tmp_path)]))
    assert line == f"error: --catalog: {tmp_path} holds no catalog files (*.yaml, *.yml)"
