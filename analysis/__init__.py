"""What people *see*: the CLI, config parsing, summaries, validation, sweeps and reports.

The notebook API (``from clustersim import simulate, sweep``) is imported on first use, so that
importing this package stays cheap and free of side effects.
"""

__all__ = ["compare", "results", "simulate", "strategies", "sweep"]


def __getattr__(name: str):
    if name in __all__:
        from clustersim.analysis import api
        return getattr(api, name)
    raise AttributeError(f"module 'clustersim.analysis' has no attribute {name!r}")
