"""An in-process fuzzer of the command line: every input kind a user hands clustersim (run
configs and their failures, sweep and costs sections, YAML text, Hugging Face config.json,
nccl-tests logs, published-run tables, catalog files, flags), mutated, must end in a result
(exit 0, or 3 for a config that does not fit) or a one-line error (exit 2), within a time limit.

``tests/test_fuzz.py`` runs a short, fixed-seed tier; ``benchmarks/fuzz_cli.py`` the long run.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import enum
import io
import json
import random
import signal
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from clustersim.analysis.cli import main

REPO = Path(__file__).resolve().parents[1]
OK_CODES = (0, 2, 3)
"""A result, a one-line error, a config that does not fit in memory."""

NASTY = [0, -1, 1, 3, 7, 2**53 + 1, 2**70, 1e308, -1e308, 1.5, -0.0, float("nan"), float("inf"),
         "", " ", "abc", "1e3", "80 GiB", "1 us", "-5 GB/s", "² steps", "٣", "१२", "1e999",
         "x" * 2000, None, True, False, [], [1, 2], {}, {"a": 1}, [[[[[]]]]], "null", "fp8",
         "ring", "ulysses", "full", "h100-sxm", "a100-80gb"]
"""Values that have broken parsers before: huge, signed, non-finite, Unicode digits, wrong
types, empty structures, plausible words in the wrong place."""

TINY_CONFIG = {
    "name": "fuzz",
    "model": {"name": "tiny", "layers": 4, "hidden": 512, "heads": 8, "vocab": 1024,
              "mlp": "swiglu", "ffn_hidden": 1536},
    "training": {"seq_len": 1024, "global_batch": 16, "micro_batch": 2, "precision": "bf16"},
    "strategy": {"tp": 2, "pp": 2, "dp": 2, "zero": 1, "recompute": "selective"},
    "cluster": {"gpu": "h100-sxm", "num_gpus": 8},
    "failures": {"days": 1, "checkpoint": {"interval": "30 min"}},
    "sweep": {"micro_batch": [1, 2], "tp": [1, 2], "pp": [1, 2]},
    "costs": {"gpu_hour": 2.5},
}


class Outcome(enum.Enum):
    OK = "ok"
    TRACEBACK = "traceback"
    SLOW = "slow"


@dataclass
class Case:
    """One command line and the files it reads (written into a fresh folder)."""

    kind: str
    argv: list[str]
    files: dict[str, str] = field(default_factory=dict)


@dataclass
class Result:
    case: Case
    outcome: Outcome
    code: int | None
    seconds: float
    detail: str = ""


class _Timeout(BaseException):
    """Raised by the alarm; a BaseException so that no ``except Exception`` swallows it."""


def run_case(case: Case, folder: Path, limit_s: int = 60) -> Result:
    """Run ``case`` in-process in ``folder``: its outcome, exit code and time."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in case.files.items():
        (folder / name).write_text(text)
    argv = [a.replace("{dir}", str(folder)) for a in case.argv]
    out, err = io.StringIO(), io.StringIO()

    def alarm(signum, frame):
        raise _Timeout()

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(limit_s)
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
        outcome, detail = Outcome.OK, ""
    except SystemExit as exit_:          # argparse's usage errors
        code = exit_.code if isinstance(exit_.code, int) else 2
        outcome, detail = Outcome.OK, ""
    except _Timeout:
        code, outcome, detail = None, Outcome.SLOW, f"over {limit_s} s"
    except Exception:                    # noqa: BLE001 - exactly what the fuzzer looks for
        code, outcome = None, Outcome.TRACEBACK
        detail = traceback.format_exc(limit=-3)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    seconds = time.perf_counter() - start
    if outcome is Outcome.OK and code == 2:
        detail = err.getvalue().strip()[-300:]
    if outcome is Outcome.OK and code not in OK_CODES:
        outcome, detail = Outcome.TRACEBACK, f"exit status {code}"
    errors = [ln for ln in err.getvalue().splitlines() if ln.startswith("error:")]
    if outcome is Outcome.OK and code == 2 and "usage:" not in err.getvalue() and \
            (len(errors) != 1 or "Traceback" in err.getvalue()):
        # progress lines may come first (a long command reports them on stderr); the error
        # itself is one line
        outcome, detail = Outcome.TRACEBACK, "not one error line: " + err.getvalue()[-300:]
    return Result(case, outcome, code, seconds, detail)


# --- mutation ------------------------------------------------------------------------------

def _paths(data, prefix=()):
    """Every (path, value) in nested mappings and lists."""
    yield prefix, data
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _paths(v, (*prefix, i))


def mutate(data, rng: random.Random, rounds: int = 2):
    """A copy of ``data`` with a few values replaced, keys deleted or added."""
    data = copy.deepcopy(data)
    for _ in range(rounds):
        paths = [p for p, _ in _paths(data) if p]
        if not paths:
            return rng.choice(NASTY)
        path = rng.choice(paths)
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        action, value = rng.random(), parent[path[-1]]
        if action < 0.3 and isinstance(value, (int, float)) and not isinstance(value, bool):
            parent[path[-1]] = rng.choice([value * 2, value // 2, value + 1, value - 1, value * 16])
        elif action < 0.6:
            parent[path[-1]] = copy.deepcopy(rng.choice(NASTY))
        elif action < 0.75 and isinstance(parent, dict):
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[rng.choice(["typo", "tp ", "Layers", "extra", path[-1] + "s"])] = \
                copy.deepcopy(rng.choice(NASTY))
    return data


def mutate_text(text: str, rng: random.Random) -> str:
    """Text damaged as files get damaged: cut, a line repeated or dropped, bytes changed."""
    lines = text.splitlines(keepends=True) or [""]
    action = rng.random()
    if action < 0.25:
        return text[: rng.randrange(len(text) + 1)]
    if action < 0.45:
        i = rng.randrange(len(lines))
        return "".join(lines[:i] + lines[i:i + 1] * rng.randint(2, 5) + lines[i + 1:])
    if action < 0.6:
        i = rng.randrange(len(lines))
        return "".join(lines[:i] + lines[i + 1:])
    chars = list(text) or [" "]
    for _ in range(rng.randint(1, 8)):
        chars[rng.randrange(len(chars))] = rng.choice("\x00:-{}[]#&*!|>'\"\t\n 9²٣.e,%")
    return "".join(chars)


def _dump(data) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


# --- cases ---------------------------------------------------------------------------------

def _config_case(rng: random.Random) -> Case:
    cfg = mutate(TINY_CONFIG, rng, rounds=rng.randint(0, 3))
    text = _dump(cfg) if rng.random() < 0.85 else mutate_text(_dump(TINY_CONFIG), rng)
    command = rng.choice([
        ["simulate", "{dir}/c.yaml"],
        ["simulate", "{dir}/c.yaml", "--json", "{dir}/out.json", "--trace", "{dir}/t.json"],
        ["failures", "{dir}/c.yaml", "--seeds", "2", "--days", "1", "--workers", "1"],
        ["sweep", "{dir}/c.yaml", "--out", "{dir}/run", "--workers", "1"],
        ["compare", "{dir}/c.yaml", "--vary", rng.choice(
            ["cluster.gpu=h100-sxm,a100-80gb", "strategy.tp=1,2", "training.micro_batch=0,1",
             "stratgy.tp=1", "cluster.num_gpus=²"])],
    ])
    return Case("config", command, {"c.yaml": text})


def _hf_case(rng: random.Random) -> Case:
    source = rng.choice(sorted((REPO / "workloads" / "hf_configs").glob("*.json")))
    hf = json.loads(source.read_text())
    text = (json.dumps(mutate(hf, rng, rounds=rng.randint(0, 2))) if rng.random() < 0.8
            else mutate_text(source.read_text(), rng))
    cfg = dict(TINY_CONFIG, model="config.json")          # beside the config
    cfg["strategy"] = {"tp": 1, "pp": 1, "dp": 8}
    return Case("hf_config", ["simulate", "{dir}/c.yaml"], {"config.json": text, "c.yaml": _dump(cfg)})


def _log_case(rng: random.Random) -> Case:
    text = mutate_text((REPO / "examples" / "nccl_tests_h100_p5.log").read_text(), rng)
    argv = ["collective", "--gpu", rng.choice(["h100-sxm", "a100-80gb", "h100", "b200"]),
            "--gpus", "8", "--against", "{dir}/log.txt"]
    return Case("nccl_log", argv, {"log.txt": text})


def _flags_case(rng: random.Random) -> Case:
    flag_values = [str(v) for v in NASTY if not isinstance(v, (list, dict))]
    argv = ["collective", "--gpu", rng.choice(["h100-sxm", "H100", "gb200"]),
            "--gpus", rng.choice(["8", "16", "0", "-3", "²", "100000000", "2"]),
            "--min-bytes", rng.choice(["8", "1M", "0", "²", "1e999", "-1"]),
            "--max-bytes", rng.choice(["8G", "1K", "x", "1e308"]),
            "--step-factor", rng.choice(["2", "1", "1.0001", "nan", "-2"])]
    if rng.random() < 0.3:
        argv[rng.randrange(1, len(argv))] = rng.choice(flag_values)
    return Case("flags", argv)


def _runs_case(rng: random.Random) -> Case:
    with (REPO / "analysis" / "data" / "published_runs_dev.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    small = [r for r in rows if int(r["num_gpus"]) <= 64][:20]
    chosen = [dict(rng.choice(small)) for _ in range(2)]
    for row in chosen:
        for _ in range(rng.randint(0, 2)):
            row[rng.choice(list(row))] = str(rng.choice(NASTY))[:200]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(chosen[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(chosen)
    text = buf.getvalue() if rng.random() < 0.8 else mutate_text(buf.getvalue(), rng)
    return Case("runs_csv", ["validate", "--runs", "{dir}/runs.csv"], {"runs.csv": text})


def _catalog_case(rng: random.Random) -> Case:
    source = REPO / "hardware_specs" / "catalog" / "devices_nvidia_hopper.yaml"
    data = yaml.safe_load(source.read_text())
    name = next(iter(data["devices"]))
    entry = {"devices": {"fuzz-gpu": mutate(data["devices"][name], rng, rounds=rng.randint(1, 2))}}
    text = _dump(entry) if rng.random() < 0.8 else mutate_text(_dump(entry), rng)
    return Case("catalog", rng.choice([["hardware", "show", "fuzz-gpu", "--catalog", "{dir}/cat.yaml"],
                                       ["hardware", "list", "--catalog", "{dir}/cat.yaml"]]),
                {"cat.yaml": text})


KINDS = {"config": _config_case, "hf_config": _hf_case, "nccl_log": _log_case,
         "flags": _flags_case, "runs_csv": _runs_case, "catalog": _catalog_case}


def cases(seed: int, count: int) -> list[Case]:
    """``count`` cases from one generator: the same seed, the same cases."""
    rng = random.Random(seed)
    kinds = sorted(KINDS)
    return [KINDS[kinds[i % len(kinds)]](rng) for i in range(count)]
