"""The hardware catalog: built-in YAML files plus the user's directories, loaded into specs.

Each YAML file may hold any of the sections ``devices``, ``nodes``, ``fabrics``,
``memory_tiers``, ``failure_models`` and ``prices`` (a node's published rental price), each a
mapping ``name -> spec``. Directories given
later override entries of the same name from earlier ones (a user's calibrated ``h100-sxm``
replaces the built-in one); within one directory a name may appear once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from clustersim.hardware_specs.cluster import ClusterSpec
from clustersim.hardware_specs.device import DeviceSpec, read_device
from clustersim.hardware_specs.domains import devices_per_domain
from clustersim.hardware_specs.errors import SpecError, shown
from clustersim.hardware_specs.fabric import FabricSpec, read_fabric
from clustersim.hardware_specs.failures import FailureModel, read_failure_model
from clustersim.hardware_specs.fields import Fields, did_you_mean
from clustersim.hardware_specs.memory import MemoryTierSpec, read_tier
from clustersim.hardware_specs.node import NodeSpec, read_node
from clustersim.hardware_specs.price import PublishedPrice, read_price
from clustersim.hardware_specs.textfile import load_yaml

BUILTIN_DIR = Path(__file__).parent / "catalog"

_READERS: dict[str, Callable[[Fields], Any]] = {
    "devices": read_device,
    "nodes": read_node,
    "fabrics": read_fabric,
    "memory_tiers": read_tier,
    "failure_models": read_failure_model,
    "prices": read_price,
}

DEFAULT_FABRIC = "rail-optimized-nonblocking"
DEFAULT_FAILURE_MODEL = "llama3-405b-h100"
DEFAULT_CHECKPOINT_STORAGE = "parallel-fs"


@dataclass(frozen=True, slots=True)
class Catalog:
    """Every named spec known to this run, by section; ``origin`` says which file each came from."""

    devices: Mapping[str, DeviceSpec]
    nodes: Mapping[str, NodeSpec]
    fabrics: Mapping[str, FabricSpec]
    memory_tiers: Mapping[str, MemoryTierSpec]
    failure_models: Mapping[str, FailureModel]
    prices: Mapping[str, PublishedPrice] = field(default_factory=dict)
    """Published on-demand prices, by the name of the node (instance) they rent."""
    origin: Mapping[tuple[str, str], str] = field(default_factory=dict)

    def section(self, name: str) -> Mapping[str, Any]:
        return getattr(self, name)

    def get(self, section: str, name: str, field_path: str) -> Any:
        entries = self.section(section)
        if name in entries:
            return entries[name]
        hint = did_you_mean(name, entries)
        raise SpecError(field_path, f"unknown {section[:-1].replace('_', ' ')} {name!r}{hint} "
                        f"(`clustersim hardware list` shows them all)")

    def device(self, name: str, field_path: str = "cluster.gpu") -> DeviceSpec:
        return self.get("devices", name, field_path)

    def cluster(self, *, device: str, num_devices: int, node: str | None = None,
                fabric: str | None = None, failure_model: str | None = None,
                checkpoint_storage: str | None = None, devices_per_node: int | None = None,
                keep_together: int = 1, path: str = "cluster") -> ClusterSpec:
        """Assemble a :class:`ClusterSpec`; omitted parts take the device's usual node, a
        non-blocking rail-optimised fat-tree and the default failure model and storage.
        ``devices_per_node`` populates a node with fewer (or more) devices, keeping each
        device's share of NICs; without it a job larger than one scale-up domain uses an even
        share of each (``domains.devices_per_domain``: 64 of an NVL72 rack's 72 for 256 GPUs),
        holding groups of ``keep_together`` ranks (TP x CP x EP) inside one domain."""
        dev = self.device(device, f"{path}.gpu")
        node_spec = self.get("nodes", node or dev.default_node, f"{path}.node")
        if node_spec.device != dev.name:
            holding = sorted(n.name for n in self.nodes.values() if n.device == dev.name)
            raise SpecError(f"{path}.node", f"{node_spec.name} holds {node_spec.device}, not "
                            f"{dev.name}: leave out {path}.gpu (a node names its GPU) or pick "
                            f"a node that holds {dev.name} ({', '.join(holding) or 'none'})")
        if num_devices < 1:
            raise SpecError(f"{path}.num_gpus", f"expected at least 1, got {num_devices}")
        if devices_per_node is None and num_devices > node_spec.devices_per_node:
            used = devices_per_domain(num_devices, node_spec, keep_together, path)
            devices_per_node = used if used != node_spec.devices_per_node else None
        if devices_per_node is not None and devices_per_node != node_spec.devices_per_node:
            if devices_per_node < 1:
                raise SpecError(f"{path}.gpus_per_node", f"expected >= 1, got {devices_per_node}")
            nics = max(1, round(node_spec.nic_count * devices_per_node / node_spec.devices_per_node))
            node_spec = replace(node_spec, devices_per_node=devices_per_node, nic_count=nics)
        if num_devices > node_spec.devices_per_node and num_devices % node_spec.devices_per_node:
            raise SpecError(f"{path}.num_gpus", f"{num_devices} is not a whole number of "
                            f"{node_spec.name} nodes ({node_spec.devices_per_node} devices each)")
        return ClusterSpec(
            device=dev,
            node=node_spec,
            num_devices=num_devices,
            fabric=self.get("fabrics", fabric or DEFAULT_FABRIC, f"{path}.fabric"),
            failure_model=self.get("failure_models", failure_model or DEFAULT_FAILURE_MODEL,
                                   f"{path}.failure_model"),
            host_memory=self.get("memory_tiers", node_spec.host_memory, f"{path}.node"),
            local_storage=self.get("memory_tiers", node_spec.local_storage, f"{path}.node"),
            checkpoint_storage=self.get("memory_tiers",
                                        checkpoint_storage or DEFAULT_CHECKPOINT_STORAGE,
                                        f"{path}.checkpoint_storage"),
        )


def _load_file(path: Path) -> dict[str, dict[str, Any]]:
    data = load_yaml(path, "--catalog")
    if not isinstance(data, Mapping) or not data:
        got = shown(data) if data is not None else "an empty file"
        raise SpecError(path.name, f"expected a mapping of catalog sections "
                                   f"({', '.join(_READERS)}), got {got}")
    top = Fields(data, "")
    out: dict[str, dict[str, Any]] = {}
    for section, reader in _READERS.items():
        try:
            out[section] = top.mapping(section, reader)
        except SpecError as err:
            raise SpecError(f"{path.name}: {err.field}", err.message) from None
    try:
        top.done()
    except SpecError as err:
        raise SpecError(f"{path.name}: {err.field}",
                        "unknown section; expected one of: " + ", ".join(_READERS)) from None
    return out


def _yaml_files(directory: Path) -> list[Path]:
    if not directory.exists():
        raise SpecError("--catalog", f"{directory}: no such file or directory")
    if not directory.is_dir():
        raise SpecError("--catalog", f"expected a directory or a YAML file, got a special file: "
                                     f"{directory}")
    files = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml"))
    if not files:
        raise SpecError("--catalog", f"{directory} holds no catalog files (*.yaml, *.yml)")
    return files


@functools.lru_cache(maxsize=16)
def _load_cached(dirs: tuple[Path, ...], files: tuple[Path, ...]) -> Catalog:
    merged: dict[str, dict[str, Any]] = {s: {} for s in _READERS}
    origin: dict[tuple[str, str], str] = {}
    sources = [(d, _yaml_files(d)) for d in dirs] + [(f.parent, [f]) for f in files]
    for directory, paths in sources:
        seen_here: dict[tuple[str, str], Path] = {}
        for path in paths:
            for section, entries in _load_file(path).items():
                for name, spec in entries.items():
                    key = (section, name)
                    if key in seen_here:
                        raise SpecError(f"{path.name}: {section}.{name}",
                                        f"also defined in {seen_here[key].name}")
                    seen_here[key] = path
                    merged[section][name] = spec
                    origin[key] = str(path)
    _check_references(merged, origin)
    return Catalog(origin=origin, **merged)


REFERENCES = (("nodes", "device", "devices"), ("nodes", "host_memory", "memory_tiers"),
              ("nodes", "local_storage", "memory_tiers"), ("devices", "default_node", "nodes"))
"""(section, field, the section its value names): checked once every file is merged, so that a
typo is reported at its own entry, not later as the config's ``cluster.gpu``."""


def _check_references(merged: Mapping[str, Mapping[str, Any]],
                      origin: Mapping[tuple[str, str], str]) -> None:
    def where(section: str, name: str) -> str:
        return f"{Path(origin[(section, name)]).name}: {section}.{name}"

    for name in merged["prices"]:
        if name not in merged["nodes"]:
            raise SpecError(where("prices", name),
                            f"prices no known node{did_you_mean(name, merged['nodes'])}")
    for section, key, target in REFERENCES:
        for name, spec in merged[section].items():
            value = getattr(spec, key)
            if value and value not in merged[target]:
                raise SpecError(f"{where(section, name)}.{key}",
                                f"unknown {target[:-1].replace('_', ' ')} {value!r}"
                                f"{did_you_mean(value, merged[target])}")


def load_catalog(extra: Iterable[str | Path] = ()) -> Catalog:
    """The built-in catalog, overridden by each extra directory or YAML file in order."""
    dirs, files = [BUILTIN_DIR], []
    for item in extra:
        p = Path(item).expanduser().resolve()
        if p.is_file():
            files.append(p)
        else:
            dirs.append(p)
    return _load_cached(tuple(dirs), tuple(files))


def with_device(cluster: ClusterSpec, device: DeviceSpec) -> ClusterSpec:
    """The same cluster with another device spec (e.g. a calibrated or degraded one)."""
    return replace(cluster, device=device)
