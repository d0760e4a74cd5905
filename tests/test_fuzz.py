"""The short tier of the command-line fuzzer (``tests/fuzzing.py``): a fixed set of generated
inputs of every kind ends in a result or a one-line error, each within the time limit. The long
run is ``python benchmarks/fuzz_cli.py``."""

import pytest

from tests.fuzzing import KINDS, Outcome, cases, run_case

pytestmark = pytest.mark.slow  # hundreds of generated configs through the CLI

SEED, COUNT = 20261201, 120


@pytest.mark.parametrize("index", range(0, COUNT, 20))
def test_generated_inputs_end_in_a_result_or_a_one_line_error(tmp_path, index):
    for i, case in enumerate(cases(SEED, COUNT)[index:index + 20]):
        result = run_case(case, tmp_path / str(i), limit_s=60)
        assert result.outcome is Outcome.OK, (case.kind, case.argv, result.detail)


def test_the_generator_covers_every_input_kind_and_is_deterministic():
    first, again = cases(7, 60), cases(7, 60)
    assert {c.kind for c in first} == set(KINDS)
    assert [(c.argv, c.files) for c in first] == [(c.argv, c.files) for c in again]


def test_the_harness_reports_a_traceback_as_one(tmp_path, monkeypatch):
    import tests.fuzzing as fuzzing

    def broken(argv):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(fuzzing, "main", broken)
    result = run_case(fuzzing.Case("flags", ["simulate"]), tmp_path)
    assert result.outcome is Outcome.TRACEBACK and "ZeroDivisionError" in result.detail
