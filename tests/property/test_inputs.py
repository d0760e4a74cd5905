"""Property tests of the input readers: whatever they are handed (a run config, a trace's JSON,
an nccl-tests log, a sweep's points.csv), they return a value or raise a one-line SpecError
naming the input, never another exception."""

import io
import string

from hypothesis import given
from hypothesis import strategies as st

from clustersim.hardware_specs import SpecError
from tests.fuzzing import NASTY, TINY_CONFIG, mutate

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=30)
"""Any JSON-like value (NaN and infinity included: YAML reads them)."""


def _one_line(err: SpecError) -> bool:
    return "\n" not in str(err) and len(str(err)) < 2000


def _config_values():
    """A tiny run config with some values replaced by anything JSON-like or a known nasty one."""
    return st.tuples(st.integers(0, 2**32), JSON, st.sampled_from(NASTY))


@given(_config_values())
def test_a_run_config_is_read_or_refused_in_one_line(drawn):
    import random

    from clustersim.analysis.config import config_from_mapping
    seed, value, nasty = drawn
    rng = random.Random(seed)
    data = mutate(TINY_CONFIG, rng, rounds=rng.randint(1, 3))
    section = rng.choice(["model", "training", "strategy", "cluster"])
    if isinstance(data.get(section), dict):
        key = rng.choice(sorted(data[section]) or ["x"])
        data[section][key] = rng.choice([value, nasty])
    try:
        config_from_mapping(data)
    except SpecError as err:
        assert _one_line(err)


@given(JSON)
def test_a_trace_json_is_read_or_refused_in_one_line(data):
    from clustersim.workloads.trace_io import trace_from_dict
    try:
        trace_from_dict(data)
    except SpecError as err:
        assert _one_line(err)


@given(st.lists(st.text(alphabet=string.printable + "²٣µ", max_size=80), max_size=12))
def test_an_nccl_tests_log_is_read_or_refused_in_one_line(tmp_path_factory, lines):
    from clustersim.analysis.validation.nccl_tests_log import read_log
    path = tmp_path_factory.mktemp("log") / "log.txt"
    header = "#  size  count  type  redop  root  time  algbw  busbw  #wrong  time  algbw  busbw  #wrong"
    path.write_text("\n".join([header, *lines]) + "\n")
    try:
        read_log(str(path))
    except SpecError as err:
        assert _one_line(err)


@given(st.lists(st.text(alphabet=string.printable, max_size=120), max_size=8))
def test_a_damaged_points_file_never_breaks_the_run_store(tmp_path_factory, lines):
    import csv

    from clustersim.analysis.sweeps.run_store import POINTS, RunStore
    root = tmp_path_factory.mktemp("run")
    store = RunStore(root)
    store.append_point({"index": 0, "key": "tp1", "tokens_per_s": 1.0, "error": ""})
    store.append_point({"index": 1, "key": "tp2", "tokens_per_s": 2.0, "error": ""})
    with (root / POINTS).open("a") as fh:
        fh.write("\n".join(lines))
    points = store.read_points()
    assert set(points) <= {"tp1", "tp2"} | {ln.split(",")[1] for ln in lines if ln.count(",") >= 1}
    store.repair()
    again = store.read_points()
    assert again == points, "repair keeps exactly what readers read"
    rows = list(csv.reader(io.StringIO((root / POINTS).read_text())))
    keys = [r[1] for r in rows[1:]]
    assert len(keys) == len(set(keys)), "each key once"
