"""``clustersim calibrate microbench|fit|validate|all``: calibrate on the hardware at hand and
see how well the simulator predicts a real training job there.

- ``microbench --out DIR``: measure kernels and collectives with real torch (DIR/microbench.json);
- ``fit DIR --out FILE.yaml``: a calibrated hardware profile the catalog loads (``--catalog``);
- ``validate --profile FILE.yaml``: train a small GPT for real under several strategies and
  print measured versus predicted step time (``--json``, ``--report``);
- ``all --out DIR``: the three in a row (DIR/profile.yaml, DIR/validate.json, DIR/report.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from clustersim.hardware_specs import SpecError, load_catalog

from clustersim.analysis.cli.common import (
    add_catalog_option, add_command, non_negative_int,
    output_file, output_path, positive_int, write_json,
)

MICROBENCH_FILE = "microbench.json"
BUSY_HOST_CORES = 0.25
"""Load of other processes (cores) above which a measurement is flagged as disturbed."""
DEFAULT_BASE = {"cpu": "cpu-core"}
"""The uncalibrated catalog entry a profile starts from, by device type."""


def _require_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise SpecError("calibrate", "needs torch: pip install 'clustersim[calibrate]'") from None


def _device(text: str) -> str:
    if text not in ("auto", "cpu", "cuda"):
        raise SpecError("--device", f"expected auto, cpu or cuda, got {text!r}")
    if text == "auto":
        import torch
        return "cuda" if torch.cuda.is_available() else "cpu"
    return text


def _sizes(text: str, field: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SpecError(field, f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise SpecError(field, f"expected integers >= 1, got {text!r}")
    return values


def _add_measure_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default)")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="intra-op threads per rank (default 1)")


def _add_fit_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", help="name of the profile's device and node (default: file stem)")
    p.add_argument("--base", help="catalog device the profile starts from (default: cpu-core "
                                  "for CPUs)")


def _add_validate_options(p: argparse.ArgumentParser) -> None:
    from clustersim.analysis.calibration.compare import DEFAULT_STRATEGIES
    p.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES),
                   help=f"comma-separated, e.g. dp2,fsdp2,tp2,pp2,pp2xdp2 (default: "
                        f"{','.join(DEFAULT_STRATEGIES)})")
    p.add_argument("--repeat", type=positive_int, default=1,
                   help="real runs per strategy (median)")
    p.add_argument("--steps", type=positive_int, default=10,
                   help="timed steps per run (default 10)")
    p.add_argument("--warmup", type=non_negative_int, default=3,
                   help="untimed steps first (default 3)")
    p.add_argument("--seed", type=non_negative_int, default=0,
                   help="seed of the calibration model's weights and data (default 0)")
    p.add_argument("--baseline", default=None,
                   help="also predict with this uncalibrated catalog device (default: the "
                        "profile's base entry; 'none' to skip)")


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "calibrate", help="calibrate on real hardware and validate against "
                                           "real torch training", examples=[
        ("clustersim calibrate all --out calib/ --quick",
         "measure, fit a profile and validate it on this machine (needs torch)"),
        ("clustersim simulate my_job.yaml --catalog calib/profile.yaml",
         "then simulate with the fitted profile"),
    ])
    cmds = p.add_subparsers(dest="calibrate_command", required=True, metavar="STEP")

    mb = cmds.add_parser("microbench", help="measure kernels and collectives with torch")
    mb.add_argument("--out", type=output_path, required=True, metavar="DIR",
                    help="folder to write microbench.json into")
    mb.add_argument("--quick", action="store_true", help="a small subset (smoke tests)")
    mb.add_argument("--world-sizes", default="", help="collective world sizes (default: 2 up "
                                                      "to the ranks, powers of two)")
    mb.add_argument("--ranks", type=non_negative_int, default=0, help="compute ranks run at once "
                                                         "(default: one per core or GPU)")
    _add_measure_options(mb)
    mb.set_defaults(func=run_microbench)

    ft = cmds.add_parser("fit", help="fit a hardware profile from microbenchmarks")
    ft.add_argument("prof", metavar="DIR", help="folder with microbench.json")
    ft.add_argument("--out", type=output_path, required=True, metavar="FILE.yaml",
                    help="the fitted profile, a catalog file for --catalog")
    _add_fit_options(ft)
    add_catalog_option(ft)
    ft.set_defaults(func=run_fit)

    va = cmds.add_parser("validate", help="real training vs prediction for several strategies")
    va.add_argument("--profile", required=True, metavar="FILE.yaml",
                    help="profile that `calibrate fit` wrote")
    va.add_argument("--json", type=output_file, metavar="OUT", help="write the rows as JSON")
    va.add_argument("--report", type=output_file, metavar="OUT.md",
                    help="write a Markdown report with a plot")
    _add_validate_options(va)
    _add_measure_options(va)
    add_catalog_option(va)
    va.set_defaults(func=run_validate)

    al = cmds.add_parser("all", help="microbench, fit and validate in one go")
    al.add_argument("--out", type=output_path, required=True, metavar="DIR",
                    help="folder for the measurements, profile.yaml and the report")
    al.add_argument("--quick", action="store_true", help="a small microbenchmark subset")
    _add_fit_options(al)
    _add_validate_options(al)
    _add_measure_options(al)
    add_catalog_option(al)
    al.set_defaults(func=run_all)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_microbench(args: argparse.Namespace) -> int:
    _require_torch()
    out = _microbench(args, Path(args.out))
    print(f"wrote {out}")
    return 0


def _microbench(args: argparse.Namespace, folder: Path) -> Path:
    from clustersim.analysis.calibration.microbench import Plan, default_ranks, run_microbench as measure
    device = _device(args.device)
    ranks = getattr(args, "ranks", 0) or default_ranks(device)
    if ranks < 1:
        raise SpecError("--ranks", f"no {device} devices found")
    text = getattr(args, "world_sizes", "")
    worlds = _sizes(text, "--world-sizes") if text else tuple(
        w for w in (2, 4, 8, 16, 32, 64) if w <= max(2, ranks))
    if args.threads < 1:
        raise SpecError("--threads", f"expected >= 1, got {args.threads}")
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    _say(f"microbenchmarks on {ranks} {device} rank(s), collectives on world sizes "
         f"{', '.join(map(str, worlds))} ...")
    doc = measure(Plan(quick=args.quick, world_sizes=worlds), device=device, ranks=ranks,
                  threads=args.threads)
    path = folder / MICROBENCH_FILE
    write_json(doc, path)
    _say(f"  {len(doc['records'])} measurements in {time.perf_counter() - start:.0f} s")
    for phase, cores in doc["setup"]["foreign_load_cores"].items():
        _warn_if_busy(cores, f"the {phase.replace('_', ' ')} microbenchmarks")
    return path


def _warn_if_busy(cores: float | None, what: str) -> None:
    if cores is not None and cores > BUSY_HOST_CORES:
        _say(f"warning: other processes kept {cores:.2f} cores busy during {what}; on a "
             "quieter host the numbers would differ")


def _read_microbench(folder: Path) -> dict:
    path = folder / MICROBENCH_FILE if folder.is_dir() else folder
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise SpecError("DIR", f"no {MICROBENCH_FILE} in {folder} (run `clustersim calibrate "
                        "microbench --out DIR` first)") from None
    except json.JSONDecodeError as err:
        raise SpecError("DIR", f"{path} is not valid JSON: {err}") from None
    if not isinstance(doc, dict) or doc.get("version") != 1:
        raise SpecError("DIR", f"{path} is not a clustersim microbenchmark file (version 1)")
    return doc


def _fit(args: argparse.Namespace, prof: Path, out: Path) -> Path:
    from clustersim.analysis.calibration.fit import fit_profile, profile_yaml
    doc = _read_microbench(prof)
    device_type = doc.get("setup", {}).get("device", "cpu")
    base = args.base or DEFAULT_BASE.get(device_type)
    if not base:
        raise SpecError("--base", f"give the catalog entry of the measured {device_type} device "
                        "(e.g. --base h100-sxm)")
    catalog = load_catalog(args.catalog)
    base_device = catalog.device(base, "--base")
    base_node = catalog.get("nodes", base_device.default_node, "--base")
    name = args.name or out.stem
    profile = fit_profile(doc, base_device, base_node, name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(profile_yaml(profile))
    load_catalog([out])  # the profile must load like any catalog file
    return out


def run_fit(args: argparse.Namespace) -> int:
    out = _fit(args, Path(args.prof), Path(args.out))
    print(f"wrote {out} (use it with --catalog {out})")
    return 0


def _validate(args: argparse.Namespace, profile: Path, json_out: Path | None,
              report_out: Path | None) -> int:
    from clustersim.analysis.calibration.compare import compare, profile_device
    from clustersim.analysis.calibration.report import summary_lines, table, write_report
    from clustersim.analysis.calibration.train import Timing, check_runnable, measure
    if args.repeat < 1 or args.steps < 1 or args.warmup < 0:
        raise SpecError("--repeat", "expected --repeat >= 1, --steps >= 1, --warmup >= 0")
    catalog = list(args.catalog) + [profile]
    name = profile_device(profile)
    device_spec = load_catalog(catalog).device(name, "--profile")
    baseline = args.baseline or device_spec.provenance.get("base")
    baseline = None if baseline in (None, "none") else baseline
    device = _device(args.device)
    timing = Timing(steps=args.steps, warmup=args.warmup, seed=args.seed)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    rows = compare(strategies, device=name, catalog=catalog, repeats=args.repeat,
                   baseline=baseline, threads=args.threads, progress=_say, check=check_runnable,
                   measure=lambda job: measure(job, timing, device=device, threads=args.threads))
    print(table(rows, baseline))
    for line in summary_lines(rows, baseline):
        print(line)
    for r in rows:
        _warn_if_busy(r.foreign_cores, f"the real runs of {r.strategy}")
    if json_out:
        write_json([r.to_dict() for r in rows], json_out)
        print(f"wrote {json_out}")
    if report_out:
        setup = {"strategies": ", ".join(strategies), "repeats": args.repeat,
                 "timed steps": args.steps, "warm-up steps": args.warmup,
                 "threads per rank": args.threads}
        write_report(rows, report_out, profile=name, provenance=device_spec.provenance,
                     setup=setup, baseline=baseline)
        print(f"wrote {report_out}")
    return 0


def run_validate(args: argparse.Namespace) -> int:
    _require_torch()
    return _validate(args, Path(args.profile), Path(args.json) if args.json else None,
                     Path(args.report) if args.report else None)


def run_all(args: argparse.Namespace) -> int:
    _require_torch()
    folder = Path(args.out)
    start = time.perf_counter()
    prof = _microbench(args, folder)
    profile = _fit(args, prof.parent, folder / "profile.yaml")
    _say(f"fitted {profile}")
    code = _validate(args, profile, folder / "validate.json", folder / "report.md")
    print(f"calibration and validation took {time.perf_counter() - start:.0f} s")
    return code
