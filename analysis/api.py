"""The Python API for notebooks: the same work as the CLI, returning pandas DataFrames.

    from clustersim.analysis import simulate, sweep
    simulate("llama3_70b_h100")                   # a bundled example, a YAML path or a mapping
    ranking = sweep("examples/llama3_70b_h100.yaml", out="runs/llama70b", workers=2)
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from clustersim.analysis.sweeps.compare import compare as compare_rows
from clustersim.analysis.sweeps.ranking import candidates, ranking
from clustersim.analysis.sweeps.space import SweepSpace
from clustersim.analysis.step import run_step
from clustersim.analysis.sweeps.runner import LoadedConfig, from_mapping, load_for_sweep, run_sweep, strategy_columns

ConfigLike = str | Path | Mapping


def _load(config: ConfigLike, catalog: Iterable[str | Path]) -> LoadedConfig:
    if isinstance(config, Mapping):
        return from_mapping(config, None, catalog)
    return load_for_sweep(config, catalog)


def simulate(config: ConfigLike, *, catalog: Iterable[str | Path] = ()):
    """One training step of ``config`` (a YAML path or a mapping): a one-row DataFrame with
    the stable keys (breakdown flattened) and the strategy."""
    import pandas as pd
    loaded = _load(config, catalog)
    report = run_step(loaded.config)
    data = report.to_dict()
    data.pop("breakdown")
    row = {"name": data["name"], **strategy_columns(loaded.config.job),
           **{k: v for k, v in data.items() if not isinstance(v, (dict, list))},
           **report.result.breakdown.columns()}
    return pd.DataFrame([row])


def sweep(config: ConfigLike, out: str | Path | None = None, *, workers: int = 1,
          dask: str | None = None, space: SweepSpace | None = None, progress: bool = False,
          catalog: Iterable[str | Path] = ()):
    """Sweep the strategies of ``config`` and return the ranking (fastest first). Points stream
    to ``out`` (a temporary folder when None), so a rerun with the same ``out`` resumes."""
    loaded = _load(config, catalog)
    if out is None:
        with tempfile.TemporaryDirectory(prefix="clustersim-sweep-") as tmp:
            run_sweep(loaded, tmp, workers=workers, dask_address=dask, progress=progress,
                      space=space)
            return ranking(tmp, loaded.config)
    run_sweep(loaded, out, workers=workers, dask_address=dask, progress=progress, space=space)
    return ranking(out, loaded.config)


def results(run_dir: str | Path):
    """The ranking of a sweep folder (finished points only, if the sweep was interrupted)."""
    return ranking(run_dir)


def strategies(run_dir: str | Path):
    """Every enumerated strategy of a sweep folder with its status and reason."""
    return candidates(run_dir)


def compare(configs: Sequence[str | Path], vary: Sequence[str] = (), *, sweep: bool = False,
            out: str | Path | None = None, workers: int = 1, catalog: Sequence[str] = ()):
    """Clusters side by side (see ``clustersim compare``)."""
    import pandas as pd
    return pd.DataFrame(compare_rows([str(c) for c in configs], vary, sweep=sweep, out=out,
                                     catalog=catalog, workers=workers))
