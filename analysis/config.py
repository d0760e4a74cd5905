"""The run config: YAML in, typed specs out, every error naming its field.

Sections: ``model`` (preset, inline mapping, or path to a HF config.json), ``training``,
``strategy``, ``cluster`` (gpu, node, num_gpus, fabric, ...), and the optional sections that
later steps read (``failures``, ``costs``, ``simulation``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from clustersim.hardware_specs import (
    Catalog, ClusterSpec, Dtype, Placement, SpecError, load_catalog,
)
from clustersim.hardware_specs.fabric import MAX_OVERSUBSCRIPTION
from clustersim.hardware_specs.errors import shown
from clustersim.hardware_specs.fields import Fields
from clustersim.hardware_specs.mixed import GroupRequest, mixed_cluster
from clustersim.hardware_specs.textfile import load_yaml
from clustersim.workloads import Job
from clustersim.workloads.cnn.job import CnnJob, cnn_job_from_mapping, is_cnn_model
from clustersim.workloads.model_sources import resolve
from clustersim.workloads.strategy import strategy_from_mapping
from clustersim.workloads.training import Fp8Recipe, Precision, training_from_mapping
from clustersim.workloads.offload_tiers import offload_tier, with_offload_tiers  # noqa: F401

OPTIONAL_SECTIONS = ("failures", "faults", "costs", "simulation", "sweep", "name", "description")

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"
"""The bundled example configs, installed with the package."""


def bundled_examples() -> list[str]:
    return sorted(p.stem for p in EXAMPLES_DIR.glob("*.yaml"))


def config_path(config: str | Path) -> Path:
    """A config file, or a bundled example by name (``llama3_70b_h100``) or by the path the
    README uses (``examples/llama3_70b_h100.yaml``), so both work from any folder."""
    path = Path(config)
    if path.exists():
        return path
    name = path.stem if path.suffix in ("", ".yaml") and path.parent.name in ("", "examples") \
        else None
    if name and (EXAMPLES_DIR / f"{name}.yaml").exists():
        return EXAMPLES_DIR / f"{name}.yaml"
    if not path.suffix:
        raise SpecError("CONFIG", f"{config!r} is neither a file nor a bundled example (one of: "
                                  f"{', '.join(bundled_examples())})")
    return path


@dataclass(frozen=True)
class RunConfig:
    job: Job | CnnJob
    """A transformer's job, or a 3D CNN's (which only ``simulate`` runs: ``analysis/cnn_step``)."""
    cluster: ClusterSpec
    catalog: Catalog
    name: str = ""
    source: Path | None = None
    sections: Mapping[str, Any] = field(default_factory=dict)
    """The optional sections, still as YAML, for the step that owns each to parse."""


def read_yaml(path: Path) -> Mapping[str, Any]:
    data = load_yaml(path)
    if not isinstance(data, Mapping):
        raise SpecError("", f"{path}: expected a mapping with model, training, strategy, cluster")
    return data


CLUSTER_FIELDS = ("gpu", "num_gpus", "node", "fabric", "failure_model", "checkpoint_storage",
                  "gpus_per_node", "oversubscription", "placement", "catalog", "groups")
GROUP_FIELDS = ("gpu", "num_gpus", "node")


def _group_requests(f: Fields, catalog: Catalog) -> list[GroupRequest]:
    """``cluster.groups``: a list of ``{gpu, num_gpus, node}``, in device order."""
    for key in ("gpu", "num_gpus", "node"):
        if f.has(key):
            raise SpecError(f.at(key), "is set per group when cluster.groups is given")
    out = []
    for i, entry in enumerate(f.items("groups")):
        g = Fields(entry, f.at("groups") + f"[{i}]").only(GROUP_FIELDS)
        out.append(GroupRequest(gpu=_device_name(g, catalog),
                                num_gpus=g.integer("num_gpus", minimum=1),
                                node=g.text("node", "") or None))
        g.done()
    return out


def _device_name(f: Fields, catalog: Catalog) -> str:
    """``cluster.gpu``, by default the device of ``cluster.node`` (a cloud instance names its
    GPU); a list of devices points to ``cluster.groups``."""
    if isinstance(f.raw("gpu", ""), list):
        raise SpecError(f.at("gpu"), "expected one device name; for mixed devices give "
                        "cluster.groups: [{gpu: a100-80gb, num_gpus: 64}, {gpu: h100-sxm, "
                        "num_gpus: 64}]")
    if not f.has("gpu") and f.has("node"):
        return catalog.get("nodes", f.text("node"), f.at("node")).device
    return f.text("gpu")


def parse_cluster(f: Fields, catalog: Catalog, keep_together: int = 1) -> ClusterSpec:
    """``keep_together``: ranks of the job's innermost groups (TP x CP x EP), placed inside one
    scale-up domain where the job uses domains partly."""
    f.only(CLUSTER_FIELDS)
    common = dict(
        fabric=f.text("fabric", "") or None,
        failure_model=f.text("failure_model", "") or None,
        checkpoint_storage=f.text("checkpoint_storage", "") or None,
        devices_per_node=f.integer("gpus_per_node", minimum=1) if f.has("gpus_per_node") else None,
        keep_together=keep_together, path=f.path)
    if f.has("groups"):
        cluster = mixed_cluster(catalog, _group_requests(f, catalog), **common)
    else:
        cluster = catalog.cluster(device=_device_name(f, catalog),
                                  num_devices=f.integer("num_gpus", minimum=1),
                                  node=f.text("node", "") or None, **common)
    if f.has("oversubscription"):
        ratio = f.number("oversubscription", minimum=1.0, maximum=MAX_OVERSUBSCRIPTION)
        cluster = replace(cluster, fabric=cluster.fabric.with_oversubscription(ratio))
    cluster = replace(cluster, placement=f.choice("placement", Placement, Placement.PACKED))
    f.done()
    return cluster


def cluster_catalog(cluster_f: Fields, base_dir: Path | None,
                    catalog_dirs: Iterable[str | Path] = ()) -> Catalog:
    """The catalog with the directories ``cluster.catalog`` adds (relative to ``base_dir``)."""
    dirs = list(catalog_dirs)
    extra = cluster_f.raw("catalog", [])
    extra = [extra] if isinstance(extra, str) else extra
    if not isinstance(extra, list) or not all(isinstance(d, str) for d in extra):
        raise SpecError(cluster_f.at("catalog"),
                        f"expected a path or a list of paths, got {extra!r:.60}")
    for d in extra:
        p = Path(str(d)).expanduser()
        dirs.append(p if p.is_absolute() or base_dir is None else base_dir / p)
    return load_catalog(dirs)


def config_from_mapping(data: Mapping[str, Any], base_dir: Path | None = None,
                        catalog_dirs: Iterable[str | Path] = ()) -> RunConfig:
    if isinstance(data, Mapping) and "jobs" in data:
        raise SpecError("jobs", "a config of several jobs sharing one cluster is read by "
                        "`clustersim simulate` and `clustersim compare` only; give this command "
                        "one job's config (model, training, strategy, cluster)")
    top = Fields(data, "").only(("model", "training", "strategy", "cluster") + OPTIONAL_SECTIONS)
    cluster_f = top.sub("cluster", required=True)
    catalog = cluster_catalog(cluster_f, base_dir, catalog_dirs)
    if is_cnn_model(top.raw("model")):
        raise SpecError("model", f"{top.raw('model')!r:.60} is a 3D CNN; only `clustersim "
                        "simulate` runs 3D CNN configs so far")
    model = resolve(top.raw("model"), base_dir)
    training = training_from_mapping(top.raw("training"))
    strategy = strategy_from_mapping(top.raw("strategy", {}))
    cluster = parse_cluster(cluster_f, catalog, strategy.tp * strategy.cp * strategy.ep)
    job = Job(model, training, strategy).checked(cluster.num_devices)
    check_fp8_recipe(job, cluster)
    job = with_fp8_layouts(job, cluster)
    cluster = with_offload_tiers(cluster, catalog, job)
    sections = {k: top.raw(k) for k in OPTIONAL_SECTIONS if top.has(k)}
    top.done()
    return RunConfig(job=job, cluster=cluster, catalog=catalog, name=name_of(top),
                     sections=sections)


def check_fp8_recipe(job: Job, cluster: ClusterSpec, path: str = "training.fp8_recipe") -> None:
    """MXFP8 runs on tensor cores that read block scales, which Blackwell has (an ``mxfp8`` rate
    in its catalog entry) and Hopper has not: Transformer Engine's ``check_mxfp8_support``
    (``transformer_engine/pytorch/fp8.py``, TE 2.x; ``quantization.py`` in later releases) returns
    "Device compute capability 10.0 or higher required for MXFP8 execution" below sm100 (ROCm TE:
    gfx950 or higher). Without this check an H100 would run it at its FP8 rate. Every group of a
    mixed cluster is checked."""
    training = job.training
    if training.precision is not Precision.FP8 or training.fp8_recipe is not Fp8Recipe.MXFP8:
        return
    for device in (g.device for g in cluster.device_groups):
        if Dtype.MXFP8 in device.peak_flops:
            continue
        have = ", ".join(d.value for d in device.peak_flops)
        raise SpecError(path, f"mxfp8 needs block-scaled FP8 tensor cores; {device.name} has no "
                              f"mxfp8 rate (it has {have}): use delayed or tensorwise")


def with_fp8_layouts(job: Job, cluster: ClusterSpec) -> Job:
    """The job with its FP8 tensors kept transposed unless every device's FP8 GEMMs take any
    layout (``DeviceSpec.fp8_any_layout``)."""
    if not job.training.precision.quantized:
        return job
    transposed = not all(g.device.fp8_any_layout for g in cluster.device_groups)
    return replace(job, training=replace(job.training, fp8_transposed_copies=transposed))


def name_of(top: Fields) -> str:
    """The config's ``name`` (and ``description``): text, or a number written as one."""
    for key in ("description", "name"):
        value = top.raw(key, "")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise SpecError(top.at(key), f"expected text, got {shown(value)}")
    return str(top.raw("name", ""))


def load_config(path: str | Path, catalog_dirs: Iterable[str | Path] = ()) -> RunConfig:
    path = config_path(path)
    data = read_yaml(path)
    cfg = config_from_mapping(data, path.parent, catalog_dirs)
    return RunConfig(job=cfg.job, cluster=cfg.cluster, catalog=cfg.catalog,
                     name=cfg.name or path.stem, source=path, sections=cfg.sections)


def load_cnn_config(path: str | Path, catalog_dirs: Iterable[str | Path] = ()) -> RunConfig:
    """A 3D CNN's run config (``workloads/cnn/job.py`` documents its sections)."""
    path = config_path(path)
    data = read_yaml(path)
    top = Fields(data, "").only(("model", "training", "strategy", "cluster") + OPTIONAL_SECTIONS)
    name = name_of(top)
    job = cnn_job_from_mapping(data)
    catalog = load_catalog(list(catalog_dirs))
    cluster = parse_cluster(top.sub("cluster", required=True), catalog, job.grid.size)
    job = job.checked(cluster.num_devices)
    sections = {k: data[k] for k in OPTIONAL_SECTIONS if k in data}
    return RunConfig(job=job, cluster=cluster, catalog=catalog,
                     name=name or path.stem, source=path, sections=sections)
