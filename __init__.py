"""clustersim: a discrete-event simulator of GPU training clusters.

Installed, everything lives under this one namespace; the repository keeps its top-level
folders (``hardware_specs``, ``workloads``, ``simulator``, ``analysis``), which
``pyproject.toml`` maps to ``clustersim.hardware_specs`` and so on, with the arrows of the
design pointing one way: analysis -> simulator -> workloads -> hardware_specs.

    import clustersim
    clustersim.simulate("llama3_70b_h100")       # a bundled example, a YAML path or a mapping

The notebook API is imported on first use, so ``import clustersim`` stays cheap.
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("clustersim")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["compare", "results", "simulate", "strategies", "sweep"]


def __getattr__(name: str):
    if name in __all__:
        from clustersim.analysis import api
        return getattr(api, name)
    raise AttributeError(f"module 'clustersim' has no attribute {name!r}")
