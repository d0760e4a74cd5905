"""Help pages a first-time user can act on: every command shows examples that parse, name only
what exists (bundled configs, catalog devices), and lists each choice once."""

import argparse
import re
import shlex

import pytest

from clustersim.analysis.cli import build_parser
from clustersim.analysis.config import EXAMPLES_DIR, config_path
from clustersim.hardware_specs import load_catalog

PARSER = build_parser()
COMMANDS = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)).choices


def _examples(name: str) -> list[str]:
    text = COMMANDS[name].format_help()
    return [line.strip() for line in text.splitlines() if line.startswith("  clustersim ")]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_help_page_ends_with_examples_that_parse(name):
    help_text = COMMANDS[name].format_help()
    assert "\nexamples:\n" in help_text
    examples = _examples(name)
    assert any(e.split()[1] == name for e in examples), examples
    for example in examples:
        args = PARSER.parse_args(shlex.split(example)[1:])
        assert callable(args.func)


def test_examples_name_bundled_configs_and_catalog_devices_that_exist():
    catalog = load_catalog()
    for name in COMMANDS:
        for example in _examples(name):
            words = shlex.split(example)
            for word in words[2:]:
                if not word.startswith("-") and "." not in word and "/" not in word \
                        and (EXAMPLES_DIR / f"{word}.yaml").exists():
                    assert config_path(word).exists()
            for gpu in re.findall(r"(?:--gpu |cluster\.gpu=)([\w,.-]+)", example):
                for device in gpu.split(","):
                    assert device in catalog.devices, f"{example}: no device {device}"
    help_text = COMMANDS["compare"].format_help()
    for gpus in re.findall(r"cluster\.gpu=([\w,.-]+)", help_text):
        assert set(gpus.split(",")) <= set(catalog.devices), gpus


def test_collective_lists_each_operation_once_and_accepts_the_other_spelling():
    help_text = COMMANDS["collective"].format_help()
    assert "alltoall" in help_text and "all_to_all" not in help_text
    assert PARSER.parse_args(["collective", "--op", "all_to_all"]).op == "alltoall"


def test_report_help_says_it_reads_comparisons_too():
    assert "compare --out" in COMMANDS["report"].format_help()


def test_compare_reads_a_bundled_example_by_name_as_its_help_shows():
    from clustersim.analysis.sweeps.compare import variants
    [(name, raw, folder)] = variants(["llama3_8b_fsdp"], [])
    assert name == "llama3-8b-fsdp-8" and folder == EXAMPLES_DIR and raw["model"]


def _options(parser: argparse.ArgumentParser, command: tuple[str, ...] = ()):
    """(command, option) for every argument of every command and step, help flags aside."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, (*command, name))
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield command, action


def test_every_option_of_every_command_says_what_it_is():
    """``--help`` of each command and step explains each argument (``--out DIR`` alone did not
    say what went there)."""
    silent = [f"{' '.join(c)} {a.option_strings or a.dest}" for c, a in _options(build_parser())
              if not a.help]
    assert not silent


@pytest.mark.parametrize("command", [["calibrate", "all"], ["trace", "record"]])
def test_warmup_counts_the_same_way_for_both_commands_that_time_torch_steps(command, capsys):
    """``--warmup 0`` times from the first step in both; a negative count is refused, exit 2."""
    assert PARSER.parse_args([*command, "--out", "x", "--warmup", "0"]).warmup == 0
    with pytest.raises(SystemExit) as refused:
        PARSER.parse_args([*command, "--out", "x", "--warmup", "-1"])
    assert refused.value.code == 2 and "--warmup" in capsys.readouterr().err
