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

from tests.golden.examples import BY_NAME, REPO

README = REPO / "README.md"
MARKER = re.compile(r"<!--golden (?P<name>[\w.]+) (?P<format>[^>\s]*)-->(?P<text>.*?)"
                    r"<!--/golden-->")


def _ep(name: str) -> Callable[[dict], float]:
    return lambda g: g[name]["breakdown"]["exposed_comm_s"]["ep"]


def _llama405b(key: str) -> Callable[[dict], float]:
    return lambda g: g["failures_llama3_405b"][key]


def _gpu_hbm_share(g: dict) -> float:
    causes = g["failures_llama3_405b"]["interruptions_by_cause"]
    return (causes["gpu"] + causes["hbm"]) / g["failures_llama3_405b"]["interruptions_mean"]


DERIVED: dict[str, Callable[[dict], float]] = {
    "moe_ep_ratio": lambda g: (_ep("moe_fabric_contention")(g)
                               / _ep("moe_fabric_contention_rail")(g)),
    "llama405b_all_interruptions": lambda g: (_llama405b("interruptions_mean")(g)
                                              + _llama405b("planned_interruptions_mean")(g)),
    "llama405b_gpu_hbm_share": _gpu_hbm_share,
}
"""Numbers the README prints that no single golden holds."""

_HOUR = 3600.0
UNITS: dict[str, float] = {"h": _HOUR}
"""``.2f/h``: divide by an hour before formatting."""


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


def rendered(text: str, stored: dict[str, dict]) -> str:
    """``text`` with every marked number rewritten from ``stored``."""
    def one(m: re.Match) -> str:
        new = render(m["name"], m["format"], stored)
        return f"<!--golden {m['name']} {m['format']}-->{new}<!--/golden-->"
    return MARKER.sub(one, text)


def stale(text: str, stored: dict[str, dict]) -> list[str]:
    """Marked numbers whose text is not what the goldens give: ``name: README -> goldens``."""
    return [f"{m['name']}: README says {m['text']!r}, the goldens give "
            f"{render(m['name'], m['format'], stored)!r}"
            for m in MARKER.finditer(text) if m["text"] != render(m["name"], m["format"], stored)]
