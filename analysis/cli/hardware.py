"""``clustersim hardware list|show``: what the catalog holds."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

from clustersim.hardware_specs import Catalog, SpecError
from clustersim.hardware_specs.fields import did_you_mean
from clustersim.hardware_specs.units import format_bytes, format_rate, format_time

from clustersim.analysis.cli.common import add_catalog_option, add_command
from clustersim.analysis.tables import render

SECTIONS = ("devices", "nodes", "fabrics", "memory_tiers", "failure_models", "prices")


def list_catalog(catalog: Catalog) -> str:
    out = []
    devs = [[d.name, d.vendor, format_rate(max(d.peak_flops.values()), "FLOP/s"),
             format_bytes(d.memory_bytes), format_rate(d.memory_bandwidth, "B/s"), d.default_node]
            for d in catalog.devices.values()]
    out.append(render(["device", "vendor", "top dense rate", "memory", "bandwidth", "usual node"],
                      sorted(devs), title="Devices"))
    nodes = [[n.name, n.device, n.devices_per_node, n.scale_up_kind.value,
              format_rate(n.scale_up_bandwidth, "B/s"),
              f"{n.nic_count} x {format_rate(n.nic_bandwidth * 8, 'b/s')} {n.nic_kind.value}"]
             for n in catalog.nodes.values()]
    out.append(render(["node", "device", "per node", "scale-up", "per GPU each way", "NICs"],
                      sorted(nodes), title="Nodes"))
    for section in SECTIONS[2:]:
        names = sorted(catalog.section(section))
        out.append(f"{section.replace('_', ' ').capitalize()}: {', '.join(names)}")
    return "\n\n".join(out)


def _plain(value):
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {(_plain(k) if isinstance(k, enum.Enum) else k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _readable(key: str, value):
    """A spec value with its unit, for people (the JSON keeps SI numbers)."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {_readable(key, v)}" for k, v in value.items())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if "flops" in key:
        return format_rate(value, "FLOP/s")
    if "bandwidth" in key:
        return format_rate(value, "B/s")
    if key.endswith("bytes") or key in ("memory", "capacity"):
        return format_bytes(value)
    if key.endswith("_s"):
        return format_time(value)
    if key.endswith("_w"):
        return f"{value:g} W"
    return value


def show(catalog: Catalog, name: str) -> tuple[str, dict]:
    """The spec called ``name`` as text (every section that has one: a calibrated profile names
    its device and its node alike) and, as a plain dict, the first of them (the device)."""
    found = [(section, catalog.section(section)[name]) for section in SECTIONS
             if name in catalog.section(section)]
    if found:
        texts = []
        for section, spec in found:
            origin = catalog.origin.get((section, name), "")
            lines = [f"{section[:-1].replace('_', ' ')} {name}  ({origin})"]
            lines += [f"  {key}: {_readable(key, value)}" for key, value in _plain(spec).items()]
            texts.append("\n".join(lines))
        return "\n\n".join(texts), _plain(found[0][1])
    everything = sorted(n for s in SECTIONS for n in catalog.section(s))
    raise SpecError("NAME", f"nothing called {name!r} in the catalog"
                            f"{did_you_mean(name, everything)}")


def register(sub) -> None:
    p = add_command(sub, "hardware", help="list or show the hardware catalog", examples=[
        ("clustersim hardware list", "every device, node, fabric, memory tier and failure model"),
        ("clustersim hardware show h100-sxm", "one entry with its units and sources"),
    ])
    p.add_argument("action", choices=["list", "show"],
                   help="list every entry, or show one by name")
    p.add_argument("name", nargs="?", help="device, node, fabric, tier or failure model")
    p.add_argument("--json", dest="json_out", action="store_true", help="print JSON")
    add_catalog_option(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import json

    from clustersim.hardware_specs import load_catalog

    catalog = load_catalog(args.catalog)
    if args.action == "list":
        if args.name:
            raise SpecError("NAME", f"`clustersim hardware list` takes no name (got {args.name!r});"
                            f" use `clustersim hardware show {args.name}`")
        print(list_catalog(catalog))
        return 0
    if not args.name:
        raise SpecError("NAME", "`clustersim hardware show NAME` needs a name")
    text, data = show(catalog, args.name)
    print(json.dumps(data, indent=2) if args.json_out else text)
    return 0
