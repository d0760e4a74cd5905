"""``clustersim compare A.yaml B.yaml ... [--vary cluster.gpu=h100-sxm,h200-sxm]``: what
should we buy? Each config (and each combination of ``--vary`` values) is simulated with its own
strategy, or with ``--sweep`` with the best strategy a full sweep finds for it, and the clusters
are set side by side: throughput, MFU, memory, failure waste, goodput, energy and cost per token.
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import yaml

from clustersim.hardware_specs import SpecError

from clustersim.analysis.config import config_path, read_yaml
from clustersim.analysis.sweeps.costs import (
    cost_per_million_tokens, costs_for, energy_per_token_j, price_terms,
)
from clustersim.analysis.sweeps.exposure import exposure
from clustersim.analysis.sweeps.ranking import ranking
from clustersim.analysis.sweeps.run_store import COMPARE, atomic_write, to_csv
from clustersim.analysis.sweeps.shared_fabric import is_shared, run_shared, shared_from_mapping
from clustersim.analysis.step import run_step
from clustersim.analysis.sweeps.runner import LoadedConfig, from_mapping, job_of_row, run_sweep, strategy_columns
from clustersim.workloads.memory import GIB

def parse_vary(items: Sequence[str]) -> list[tuple[str, list]]:
    """``cluster.gpu=h100-sxm,h200-sxm`` -> ``("cluster.gpu", ["h100-sxm", "h200-sxm"])``."""
    out = []
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key or not values:
            raise SpecError("--vary", f"expected KEY=V1,V2,... (e.g. cluster.gpu=h100-sxm,"
                            f"h200-sxm), got {item!r}")
        out.append((key, [_scalar(v, key) for v in values.split(",")]))
    return out


def _scalar(text: str, key: str):
    """One --vary value as YAML reads it (``2`` a number, ``h200`` a name)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        raise SpecError("--vary", f"{key}: {text!r} is not a value YAML can read") from None


def with_value(raw: Mapping, dotted: str, value) -> dict:
    """A deep copy of ``raw`` with ``dotted`` (``cluster.gpu``) set to ``value``."""
    data = copy.deepcopy(dict(raw))
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise SpecError("--vary", f"{dotted}: {part} is not a mapping in the config")
        node = child
    node[parts[-1]] = value
    return data


def variants(paths: Sequence[str], vary: Sequence[tuple[str, list]]) -> list[tuple[str, dict, Path]]:
    """(name, YAML mapping, folder) of every config x every combination of ``vary``."""
    out = []
    for path in map(config_path, paths):
        raw = dict(read_yaml(path))
        base = str(raw.get("name") or path.stem)
        for combo in itertools.product(*[[(k, v) for v in values] for k, values in vary]):
            data = raw
            for key, value in combo:
                data = with_value(data, key, value)
            label = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in combo)
            name = f"{base} [{label}]" if label else base
            out.append((name, {**data, "name": name}, path.parent))
    return out


def check_vary_keys(todo: Sequence[tuple[str, dict, Path]], keys: Sequence[str],
                    catalog: Sequence[str]) -> None:
    """A ``--vary`` key that names no config field, or a value that names no catalog entry
    (``cluster.gpu=h2OO``), is one error before anything runs (not a "not run" row beside the
    variants that ran, with exit status 0)."""
    for _, raw, base_dir in todo:
        try:
            if is_shared(raw):
                shared_from_mapping(raw, base_dir, catalog)
            else:
                from_mapping(raw, base_dir, catalog)
        except SpecError as err:
            typo = next((k for k in keys if k == err.field or k.startswith(f"{err.field}.")), None)
            if typo and err.message.startswith("unknown "):
                detail = err.message if err.field == typo else str(err)
                raise SpecError("--vary", f"{typo}: {detail}") from None


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")


def row_for(loaded: LoadedConfig, step: Mapping, strategy: Mapping) -> dict:
    """One cluster's line of the comparison."""
    config = loaded.config
    cluster, job = config.cluster, config.job
    costs = costs_for(config.sections.get("costs"), cluster, config.catalog)
    tokens = float(step["tokens_per_s"])
    e = exposure(job, cluster, float(step["step_time_s"]))
    return {
        "name": config.name, "gpu": cluster.device.name, "num_gpus": cluster.num_devices,
        "node": cluster.node.name, "gpus_per_node": cluster.devices_per_node,
        "nics_per_node": cluster.node.nic_count, "fabric": cluster.fabric.name,
        "oversubscription": cluster.fabric.tiers[0].oversubscription,
        **strategy, "step_time_s": float(step["step_time_s"]), "tokens_per_s": tokens,
        "mfu": float(step["mfu"]), "peak_memory_gib": float(step["peak_memory_gib"]),
        "failure_waste": e.waste, "goodput_tokens_per_s": tokens * (1.0 - e.waste),
        "energy_per_token_j": energy_per_token_j(costs, cluster, tokens),
        "cost_per_million_tokens": cost_per_million_tokens(costs, cluster, tokens),
        "currency": costs.currency if costs.priced else "", "price_terms": price_terms(costs),
        "problem": "",
    }


def compare_one(name: str, raw: dict, base_dir: Path, catalog: Sequence[str], sweep_dir: Path | None,
                workers: int, dask_address: str | None, progress: bool | None) -> dict:
    """Simulate (or sweep) one variant; a config that does not work gives a row saying why."""
    try:
        if sweep_dir is None:
            loaded = from_mapping(raw, base_dir, catalog)
            report = run_step(loaded.config)
            step = {**report.result.to_dict(),
                    "peak_memory_gib": max(s.memory.required for s in report.memory) / GIB}
            return row_for(loaded, step, strategy_columns(loaded.config.job))
        loaded = from_mapping(raw, base_dir, catalog)
        outcome = run_sweep(loaded, sweep_dir, workers=workers, dask_address=dask_address,
                            progress=progress)
        frame = ranking(sweep_dir, loaded.config)
        if frame.empty:
            return {"name": name, "problem": outcome.why_nothing_ranked()}
        best = frame.iloc[0]
        job = job_of_row(loaded.config, best)
        loaded = LoadedConfig(replace(loaded.config, job=job), loaded.raw)
        return row_for(loaded, best, strategy_columns(job))
    except SpecError as err:
        return {"name": name, "problem": str(err)}


def shared_rows(name: str, raw: dict, base_dir: Path, catalog: Sequence[str],
                sweep: bool) -> list[dict]:
    """One line per job of a cluster shared by several jobs (``analysis/sweeps/shared_fabric.py``),
    each with its step time together and what it loses to the others."""
    try:
        if sweep:
            raise SpecError("--sweep", "a shared cluster runs its jobs' own strategies; "
                                       "compare it without --sweep")
        config = shared_from_mapping(raw, base_dir, catalog, name=name)
        result = run_shared(config)
    except SpecError as err:
        return [{"name": name, "problem": str(err)}]
    rows = []
    for job_config, outcome in zip(config.jobs, result.jobs):
        job = job_config.job
        loaded = LoadedConfig(replace(job_config, name=f"{name} / {job_config.name}"), raw)
        step = {**outcome.together.to_dict(),
                "peak_memory_gib": max(s.memory.required for s in job.memory()) / GIB}
        rows.append({**row_for(loaded, step, strategy_columns(job)),
                     "placement": config.placement.value,
                     "alone_step_time_s": outcome.alone.step_time_s, "lost_s": outcome.lost_s,
                     "lost_fraction": outcome.lost_s / outcome.alone.step_time_s})
    return rows


def compare(paths: Sequence[str], vary: Sequence[str] = (), *, sweep: bool = False,
            out: str | Path | None = None, catalog: Sequence[str] = (), workers: int = 1,
            dask_address: str | None = None, progress: bool | None = None) -> list[dict]:
    if sweep and out is None:
        raise SpecError("--out", "--sweep keeps each cluster's sweep in a folder: give --out DIR")
    keys = parse_vary(vary)
    todo = variants(paths, keys)
    check_vary_keys(todo, [k for k, _ in keys], catalog)
    rows = []
    for name, raw, base_dir in todo:
        sweep_dir = Path(out) / slug(name) if sweep else None
        if is_shared(raw):
            rows += shared_rows(name, raw, base_dir, catalog, sweep)
        else:
            rows.append(compare_one(name, raw, base_dir, catalog, sweep_dir, workers,
                                    dask_address, progress))
        if out is not None:
            Path(out).mkdir(parents=True, exist_ok=True)
            atomic_write(Path(out) / COMPARE, to_csv(_uniform(rows)))
    return rows


def _uniform(rows: list[dict]) -> list[dict]:
    """Rows with the same columns (failed ones have only a name and a problem)."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    return [{k: r.get(k, "") for k in columns} for r in rows]
