"""README numbers rendered from the goldens, so they cannot go stale.

A generated number sits between markers that name where it comes from and how it is printed:

    <!--golden moe_fabric_contention.step_time_s .2f-->6.89<!--/golden-->

The name is ``<example>.<key>[.<key>...]`` into ``tests/golden/<example>.json``, or
``derived.<name>`` for the few numbers computed from several goldens (:data:`DERIVED`); the
format is a Python format spec (``.1%`` prints a percentage). The markers are HTML comments, so
the README renders the number alone; text around them is free to change.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from tests.golden.examples import REPO
from tests.golden.registry import BY_NAME

README = REPO / "README.md"
MARKER = re.compile(r"<!--golden (?P<name>[\w.]+) (?P<format>[^>\s]*)-->(?P<text>.*?)"
                    r"<!--/golden-->")
TABLE = re.compile(r"<!--golden-table (?P<name>[\w.]+)-->\n(?P<text>.*?)<!--/golden-table-->",
                   re.DOTALL)
"""A whole Markdown table rendered from a golden (:data:`TABLES`)."""


def _ep(name: str) -> Callable[[dict], float]:
    return lambda g: g[name]["breakdown"]["exposed_comm_s"]["ep"]


def _llama405b(key: str) -> Callable[[dict], float]:
    return lambda g: g["failures_llama3_405b"][key]


def _gpu_hbm_share(g: dict) -> float:
    causes = g["failures_llama3_405b"]["interruptions_by_cause"]
    return (causes["gpu"] + causes["hbm"]) / g["failures_llama3_405b"]["interruptions_mean"]


def _errors(name: str, prefix: str = "", gpu: str = "", precision: str = "",
            excluded: frozenset[str] = frozenset()) -> Callable[[dict], list[float]]:
    """Errors of a validation golden's rows that ran and fit in memory (as ``validate``
    counts them) whose id starts with ``prefix``, on ``gpu``, in ``precision`` (an FP8
    recipe for FP8 rows), leaving out the ``excluded`` ids."""
    def errors(g: dict) -> list[float]:
        return [r["error"] for rid, r in g[name]["rows"].items()
                if r["error"] is not None and r["fits_in_memory"] and rid.startswith(prefix)
                and gpu in ("", r["gpu"]) and precision in ("", r["precision"])
                and rid not in excluded]
    return errors


def _spread(*subset: str, excluded: frozenset[str] = frozenset()
            ) -> dict[str, Callable[[dict], float]]:
    """MAPE, count, lowest and highest error of a subset, as ``<key>_mape`` ... entries."""
    errors = _errors(*subset, excluded=excluded)
    return {"mape": lambda g: sum(map(abs, errors(g))) / len(errors(g)),
            "n": lambda g: len(errors(g)),
            "min": lambda g: min(errors(g)), "max": lambda g: max(errors(g)),
            "max_abs": lambda g: max(map(abs, errors(g)))}


def _peak_memory_errors(name: str) -> Callable[[dict], list[float]]:
    """Peak-memory errors of a validation golden's rows that print a measured peak."""
    return lambda g: [r["peak_memory_error"] for r in g[name]["rows"].values()
                      if r.get("peak_memory_error") is not None]


def _memory_spread(name: str) -> dict[str, Callable[[dict], float]]:
    errors = _peak_memory_errors(name)
    return {"mape": lambda g: sum(map(abs, errors(g))) / len(errors(g)),
            "n": lambda g: len(errors(g)),
            "min": lambda g: min(errors(g)), "max": lambda g: max(errors(g))}


def _row(name: str, rid: str) -> Callable[[dict], float]:
    return lambda g: g[name]["rows"][rid]["error"]


_SUBSETS = {
    "dev_megatron": ("validate_dev", "narayanan", ""),
    "dev_mpt": ("validate_dev", "mpt", ""),
    "mf_nemo2407": ("validate_megatron_family", "nemo2407", ""),
    "mf_mbridge_h100": ("validate_megatron_family", "mbridge", "h100-sxm"),
    "mf_mbridge_b200": ("validate_megatron_family", "mbridge", "b200"),
    "mf_korthikanti": ("validate_megatron_family", "korthikanti", ""),
    "mf_weak": ("validate_megatron_family", "megatronlm_h100_weak", ""),
    "mf_bloom": ("validate_megatron_family", "bloom", ""),
    "tt_a100": ("validate_torchtitan", "torchtitan-", ""),
    "tt_h100": ("validate_torchtitan", "torchtitan_h100", ""),
    "bw_b200": ("validate_blackwell", "", "b200"),
    "bw_gb200": ("validate_blackwell", "", "gb200"),
    "bw_gb300_fp8": ("validate_blackwell", "", "gb300", "tensorwise"),
    "bw_mxfp8": ("validate_blackwell", "", "", "mxfp8"),
    "bw_b200_mxfp8": ("validate_blackwell", "", "b200", "mxfp8"),
    "bw_gb200_mxfp8": ("validate_blackwell", "", "gb200", "mxfp8"),
    "bw_gb300_mxfp8": ("validate_blackwell", "", "gb300", "mxfp8"),
    "bw_b300_mxfp8": ("validate_blackwell", "", "b300", "mxfp8"),
    "bw_nvfp4": ("validate_blackwell", "", "", "nvfp4"),
    "bw_gb200_nvfp4": ("validate_blackwell", "", "gb200", "nvfp4"),
    "bw_gb300_nvfp4": ("validate_blackwell", "", "gb300", "nvfp4"),
}
"""Row groups the README's accuracy section speaks of: (golden, id prefix, GPU, precision)."""

_ROWS = {
    "tt_llama3_70b": ("validate_torchtitan", "torchtitan-llama3-70b-64g-a100-full"),
    "tt_llama2_70b": ("validate_torchtitan", "torchtitan-llama2-70b-64g-a100-full"),
    "tt_llama2_13b": ("validate_torchtitan", "torchtitan-llama2-13b-64g-a100-none"),
    "tt_llama3_8b": ("validate_torchtitan", "torchtitan-llama3-8b-64g-a100-selective-layer"),
    "tt_llama3_8b_op": ("validate_torchtitan", "torchtitan-llama3-8b-64g-a100-selective-op"),
    "tt_llama2_13b_op": ("validate_torchtitan", "torchtitan-llama2-13b-64g-a100-selective-op"),
    "tt_llama2_13b_layer": ("validate_torchtitan",
                            "torchtitan-llama2-13b-64g-a100-selective-layer"),
    "tt_llama2_70b_op": ("validate_torchtitan", "torchtitan-llama2-70b-64g-a100-selective-op"),
    "tt_h100_70b_fp8": ("validate_torchtitan", "torchtitan_h100_llama3.1_70b_256gpu_2d_fp8"),
    "tt_h100_70b_fp8_async": ("validate_torchtitan",
                              "torchtitan_h100_llama3.1_70b_256gpu_2d_fp8_asynctp"),
    "tt_h100_70b_bf16": ("validate_torchtitan",
                         "torchtitan_h100_llama3_70b_256gpu_2d_bf16_vanillatp"),
    "tt_h100_70b_bf16_async": ("validate_torchtitan",
                               "torchtitan_h100_llama3_70b_256gpu_2d_bf16_asynctp"),
    "tt_h100_70b_fp8_2506": ("validate_torchtitan",
                             "torchtitan_h100_llama3_70b_256gpu_2d_fp8_tensorwise_vanillatp"),
    "tt_h100_70b_fp8_2506_async": ("validate_torchtitan",
                                   "torchtitan_h100_llama3_70b_256gpu_2d_fp8_tensorwise_asynctp"),
    "tt_h100_405b_1f1b": ("validate_torchtitan", "torchtitan_h100_llama3.1_405b_512gpu_3d_1f1b"),
    "tt_h100_405b_interleaved": ("validate_torchtitan",
                                 "torchtitan_h100_llama3.1_405b_512gpu_3d_interleaved"),
    "mf_weak_32b": ("validate_megatron_family", "megatronlm_h100_weak_32B"),
    "moe_deepseek_v3_report": ("validate_moe", "deepseek_v3_report_h800_2048gpu"),
    **{f"bw_dsv3_{gpu}": ("validate_blackwell", f"mbridge_26.04.01_{gpu}_deepseekv3_mxfp8_256gpu")
       for gpu in ("b200", "b300", "gb200", "gb300")},
    "moe_mixtral_gb200": ("validate_moe", "nemo2504_mixtral_8x7b_gb200_64gpu_fp8"),
    "moe_a2a_overlap": ("validate_moe", "mz_qwen3_235b_h100_deepep_tp2_ep32_pp8_a2a_overlap"),
    **{f"moe_card_{key}": ("validate_moe", f"mbcard_qwen3_30b_a3b_{row}") for key, row in (
        ("h100_no_overlap", "h100_16gpu_bf16_hybridep_no_a2a_overlap"),
        ("h100_overlap", "h100_16gpu_bf16_hybridep_a2a_overlap"),
        ("h100_natural", "h100_16gpu_bf16_natural_routing"),
        ("gb300_8", "gb300_8gpu_mxfp8_tuned"),
        ("gb300_256", "gb300_256gpu_mxfp8_weak_scaling"))},
    **{f"moe_card_235b_{gpu}": ("validate_moe", f"mbcard_qwen3_235b_a22b_{gpu}_256gpu_mxfp8")
       for gpu in ("gb200", "gb300")},
    "lc_llama3_128k": ("validate_long_context", "llama3_herd_405b_128k_16384gpu"),
    "lc_tt405_128k": ("validate_long_context", "torchtitan_llama3_405b_512gpu_fsdp2_cp4"),
    "lc_tt405_256k": ("validate_long_context", "torchtitan_llama3_405b_512gpu_fsdp1_cp8"),
    "lc_tt8_128k": ("validate_long_context", "torchtitan_llama3_8b_8gpu_fsdp2_cp4"),
    "lc_tt8_256k": ("validate_long_context", "torchtitan_llama3_8b_8gpu_fsdp1_cp8"),
    "lc_nemo_4k": ("validate_long_context", "nemo_llama2_7b_h100_4k_cp1"),
    "lc_nemo_32k": ("validate_long_context", "nemo_llama2_7b_h100_32k_cp2"),
    "lc_nemo_1m": ("validate_long_context", "nemo_llama2_7b_h100_1024k_cp32"),
    "lc_qwen_16k": ("validate_long_context", "mz_qwen3_235b_h100_16k_cp1"),
    "lc_qwen_128k": ("validate_long_context", "mz_qwen3_235b_h100_128k_cp8"),
}
"""Single rows the README quotes."""

MOE_FILED_REGRESSIONS = frozenset((
    # Megatron-Bridge #1998 (NVIDIA, 2026-01-20): dropless Qwen3-30B-A3B 2x slower than 25.09.
    "mb2511_qwen3_30b_a3b_h100_16gpu_fp8", "mb2511_qwen3_30b_a3b_b200_8gpu_mxfp8",
    "mb2602_qwen3_30b_a3b_h100_16gpu_fp8",
    # Megatron-Bridge #1705 / PR #1760: the 25.11 recipe's all-to-all overlap "CPU overhead".
    "mb2511_qwen3_235b_a22b_b200_64gpu_mxfp8",
))
"""MoE rows whose measurements NVIDIA itself filed as software regressions (their notes in
``analysis/data/published_runs_moe.csv``); the README quotes the MAPE without them beside the
table's."""


DERIVED: dict[str, Callable[[dict], float]] = {
    **{f"moe_unregressed_{stat}": f for stat, f in _spread(
        "validate_moe", excluded=MOE_FILED_REGRESSIONS).items()},
    **{f"{key}_{stat}": f for key, subset in _SUBSETS.items()
       for stat, f in _spread(*subset).items()},
    **{key: _row(*row) for key, row in _ROWS.items()},
    **{f"tt_mem_{stat}": f for stat, f in _memory_spread("validate_torchtitan").items()},
    **{f"tt_mem_{key}": (lambda rid: lambda g: g["validate_torchtitan"]["rows"][rid][
        "peak_memory_error"])(rid) for key, rid in (
        ("70b_2d", "torchtitan_h100_llama3.1_70b_256gpu_2d_fp8"),
        ("70b_asynctp", "torchtitan_h100_llama3.1_70b_256gpu_2d_fp8_asynctp"),
        ("405b_1f1b", "torchtitan_h100_llama3.1_405b_512gpu_3d_1f1b"),
        ("405b_interleaved", "torchtitan_h100_llama3.1_405b_512gpu_3d_interleaved"))},
    "moe_ep_ratio": lambda g: (_ep("moe_fabric_contention")(g)
                               / _ep("moe_fabric_contention_rail")(g)),
    "llama405b_all_interruptions": lambda g: (_llama405b("interruptions_mean")(g)
                                              + _llama405b("planned_interruptions_mean")(g)),
    "llama405b_gpu_hbm_share": _gpu_hbm_share,
    # Meta's 6.66 s step: Llama 3 Herd (arXiv 2407.21783) Table 4's 400 TFLOPS per GPU on 16,384
    # H100 with batches of 2,048 x 8,192 tokens, as a step time.
    "llama405b_vs_meta": lambda g: g["failures_llama3_405b"]["step_time_s"] / 6.66 - 1,
    # The examples' measured steps (their YAML headers): Megatron-Bridge's Qwen3-235B-A22B card
    # (17,905.34 ms, GB200) and its 26.04.01 table (256 x 8,192 / (4,224 x 64) s, GB200).
    "qwen3_235b_gb200_vs_card": lambda g: g["qwen3_235b_gb200"]["step_time_s"] / 17.90534 - 1,
    "llama3_70b_gb200_vs_table": (lambda g: g["llama3_70b_gb200_fsdp"]["step_time_s"]
                                  / (256 * 8192 / (4224 * 64)) - 1),
}
"""Numbers the README prints that no single golden holds."""

_HOUR = 3600.0
UNITS: dict[str, float] = {"h": _HOUR}
"""``.2f/h``: divide by an hour before formatting."""


def _sweep_points(name: str) -> Callable[[dict], list[dict]]:
    return lambda g: sorted(g[name]["points"], key=lambda p: p["rank"])


_LLAMA70B_SWEEP = "sweep_llama3_70b_h100"
_points = _sweep_points(_LLAMA70B_SWEEP)
DERIVED |= {
    "sweep70b_first_cross_node_tp_rank": lambda g: next(p["rank"] for p in _points(g)
                                                        if p["tp"] > 8),
    "sweep70b_top10_tp_in_node": lambda g: sum(p["tp"] <= 8 for p in _points(g)[:10]),
}


def _markdown_table(headers: list, rows: list[list]) -> str:
    lines = ["| " + " | ".join(map(str, headers)) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows]) + "\n"


def _ranking_table(name: str, top: int, columns: int) -> Callable[[dict], str]:
    """The first ``top`` rows of a sweep golden's ranking, as ``clustersim sweep`` prints it."""
    def render(g: dict) -> str:
        table = g[name]["table"]
        return _markdown_table(table["headers"][:columns],
                               [r[:columns] for r in table["rows"][:top]])
    return render


def _calibration_table(name: str) -> Callable[[dict], str]:
    def render(g: dict) -> str:
        rows = [[s, f"{1e3 * r['measured_s']:.0f} ms", f"{1e3 * r['predicted_s']:.0f} ms",
                 f"{r['error']:+.1%}", f"{r['baseline_error']:+.1%}"]
                for s, r in g[name]["rows"].items()]
        return _markdown_table(["strategy", "measured", "predicted", "error",
                                "uncalibrated `cpu-core`"], rows)
    return render


_TRACE_RUNS = {"dp1": "dp1, 1 rank, its own trace", "dp2": "dp2, 2 ranks (gloo), its own trace",
               "dp4_from_dp2": "dp4, 4 ranks on 2 cores, **predicted from the dp2 trace** "
                               "(`dp: 4`)",
               "pp2": "pp2, 1F1B over 2 stages (isend/irecv), its own trace"}


def _trace_table(name: str) -> Callable[[dict], str]:
    def render(g: dict) -> str:
        rows = [[label, f"{g[name][run]['simulated_s']:.3f} s",
                 f"{g[name][run]['measured_s']:.3f} s", f"{g[name][run]['error']:+.1%}",
                 f"{g[name][run]['error_vs_traced']:+.1%}"] for run, label in _TRACE_RUNS.items()]
        return _markdown_table(["run", "simulated", "measured (untraced steps)", "error",
                                "error against the traced step"], rows)
    return render


TABLES: dict[str, Callable[[dict], str]] = {
    f"{_LLAMA70B_SWEEP}.top15": _ranking_table(_LLAMA70B_SWEEP, 15, 9),
    "calibration_amd_epyc_2_cores.table": _calibration_table("calibration_amd_epyc_2_cores"),
    "traces_amd_epyc_2_cores.table": _trace_table("traces_amd_epyc_2_cores"),
}
"""Tables the README prints whole."""


def goldens() -> dict[str, dict]:
    return {name: run.stored() for name, run in BY_NAME.items() if run.path.exists()}


def value(name: str, stored: dict[str, dict]) -> float:
    head, _, rest = name.partition(".")
    if head == "derived":
        if rest not in DERIVED:
            raise KeyError(f"{name}: no such derived number (tests/golden/readme.py: DERIVED)")
        return DERIVED[rest](stored)
    if head not in stored:
        raise KeyError(f"{name}: no golden named {head!r} (tests/golden/*.json)")
    node = stored[head]
    for key in rest.split("."):
        if not isinstance(node, dict) or key not in node:
            raise KeyError(f"{name}: tests/golden/{head}.json has no {key!r} there")
        node = node[key]
    return node


def render(name: str, spec: str, stored: dict[str, dict]) -> str:
    spec, _, unit = spec.partition("/")
    number = value(name, stored)
    return format(number / UNITS[unit] if unit else number, spec)


def render_table(name: str, stored: dict[str, dict]) -> str:
    if name not in TABLES:
        raise KeyError(f"{name}: no such table (tests/golden/readme.py: TABLES)")
    return TABLES[name](stored)


def rendered(text: str, stored: dict[str, dict]) -> str:
    """``text`` with every marked number and table rewritten from ``stored``."""
    def one(m: re.Match) -> str:
        new = render(m["name"], m["format"], stored)
        return f"<!--golden {m['name']} {m['format']}-->{new}<!--/golden-->"

    def table(m: re.Match) -> str:
        return (f"<!--golden-table {m['name']}-->\n{render_table(m['name'], stored)}"
                "<!--/golden-table-->")
    return TABLE.sub(table, MARKER.sub(one, text))


def stale(text: str, stored: dict[str, dict]) -> list[str]:
    """Marked numbers and tables whose text is not what the goldens give."""
    numbers = [f"{m['name']}: README says {m['text']!r}, the goldens give "
               f"{render(m['name'], m['format'], stored)!r}"
               for m in MARKER.finditer(text)
               if m["text"] != render(m["name"], m["format"], stored)]
    return numbers + [f"table {m['name']}: README's differs from the goldens"
                      for m in TABLE.finditer(text) if m["text"] != render_table(m["name"], stored)]
