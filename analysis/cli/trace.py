"""``clustersim trace import|export|record``: bring your own workload.

- ``import FILES... --out trace.json``: PyTorch profiler (Kineto) or Chakra JSON, one file per
  rank (or a folder of them; ``--world-size N`` lets one rank's file stand for a symmetric job),
  into our trace JSON, which a config simulates with ``workload: {trace: trace.json}``;
- ``export TRACE --out DIR``: our trace JSON, or a run config's generated step, as Chakra JSON
  (one file per program, ``--every-rank`` one per rank as ASTRA-sim reads them);
- ``record --strategy dp2 --out DIR``: train the calibration GPT for real, time it, and record a
  step with torch.profiler (``DIR/rank<r>.json`` and ``DIR/measured.json``).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

from clustersim.analysis.cli.common import (
    add_catalog_option, add_command, load_checked_config,
    non_negative_int, output_file, output_path,
    positive_int, write_json,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "trace", help="import profiler/Chakra traces, export Chakra, record a "
                                       "real step", examples=[
        ("clustersim trace import rank0.json rank1.json --out trace.json",
         "PyTorch profiler files of a 2-rank job -> a trace a config simulates "
         "(workload: {trace: trace.json})"),
        ("clustersim trace export llama3_8b_fsdp --out chakra/",
         "a bundled config's step as Chakra JSON, one file per program"),
        ("clustersim trace record --strategy dp2 --out mytrace/",
         "train the calibration GPT on 2 CPU ranks and record a step (needs torch)"),
    ])
    cmds = p.add_subparsers(dest="trace_command", required=True, metavar="STEP")
    im = cmds.add_parser("import", help="Kineto or Chakra JSON -> our trace JSON")
    im.add_argument("files", nargs="+", metavar="FILE", help="one file per rank, or a folder")
    im.add_argument("--out", type=output_file, required=True, metavar="TRACE.json",
                    help="the trace to write (a config runs it as workload: {trace: ...})")
    im.add_argument("--world-size", type=positive_int, metavar="N",
                    help="one rank's file stands for a symmetric job of N ranks")
    im.add_argument("--recorded-on", metavar="DEVICE",
                    help="catalog device that recorded it (re-times compute elsewhere)")
    im.add_argument("--tokens", type=float, default=0.0, help="tokens the step processed")
    add_catalog_option(im)
    im.set_defaults(func=run_import)
    ex = cmds.add_parser("export", help="our trace (or a config's step) -> Chakra JSON")
    ex.add_argument("source", metavar="TRACE.json|CONFIG",
                    help="a trace, a config file or a bundled example's name")
    ex.add_argument("--out", type=output_path, required=True, metavar="DIR",
                    help="folder for the Chakra JSON files")
    ex.add_argument("--every-rank", action="store_true", help="one file per rank")
    ex.add_argument("--stem", default="chakra", help="file names STEM.<rank>.json")
    add_catalog_option(ex)
    ex.set_defaults(func=run_export)
    rc = cmds.add_parser("record", help="record the calibration GPT with torch.profiler")
    rc.add_argument("--strategy", default="dp2", help="dp1, dp2, tp2, fsdp2... (default dp2)")
    rc.add_argument("--out", type=output_path, required=True, metavar="DIR",
                    help="folder for the profiler traces and their timings")
    rc.add_argument("--pairs", type=positive_int, default=5,
                    help="untraced + traced step pairs, interleaved (default 5)")
    rc.add_argument("--warmup", type=non_negative_int, default=3,
                    help="untimed steps first, 0 or more (default 3)")
    rc.add_argument("--hidden", type=positive_int, help="model width (default: calibration's)")
    rc.add_argument("--global-batch", type=positive_int,
                    help="sequences per step (default: calibration's 16)")
    rc.add_argument("--device", default="cpu", help="cpu or cuda")
    rc.set_defaults(func=run_record)


def describe(trace, warnings=()) -> str:
    from clustersim.analysis.tables import key_values
    from clustersim.workloads.trace import CollectiveOp, ComputeOp, RecvOp, SendOp
    kinds: Counter = Counter()
    measured = 0.0
    for op in trace.programs[0].ops:
        kinds[type(op).__name__] += 1
        if isinstance(op, ComputeOp) and op.measured_s is not None:
            measured += op.measured_s
    source = trace.meta.get("source", {})
    files = source.get("files", []) if isinstance(source, dict) else []
    lines = key_values([
        ("ranks", f"{trace.world_size} in {len(trace.programs)} program(s)"),
        ("ops (first program)", ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))),
        ("measured compute", f"{measured:.4f} s (first program)"),
        ("collectives", sum(isinstance(o, CollectiveOp) for o in trace.programs[0].ops)),
        ("send/recv", sum(isinstance(o, (SendOp, RecvOp)) for o in trace.programs[0].ops)),
        ("source", ", ".join(f"{k}={source[k]}" for k in ("format", "device", "framework",
                                                         "host", "recorded", "recorded_on")
                             if isinstance(source, dict) and k in source)),
        ("files", "; ".join(f"{f['name']} sha256 {f['sha256'][:12]}" for f in files[:4])
         + (f" (+{len(files) - 4})" if len(files) > 4 else "")),
    ])
    return lines + "".join(f"\nwarning: {w}" for w in warnings)


def run_import(args: argparse.Namespace) -> int:
    from clustersim.hardware_specs import load_catalog
    from clustersim.workloads.trace_import import import_files
    from clustersim.workloads.trace_io import save_trace
    if args.recorded_on:
        load_catalog(args.catalog).get("devices", args.recorded_on, "--recorded-on")
    imported = import_files(args.files, world_size=args.world_size,
                            recorded_on=args.recorded_on, tokens=args.tokens)
    save_trace(imported.trace, Path(args.out))
    print(describe(imported.trace, imported.warnings))
    print(f"\nwrote {args.out}")
    return 0


def _trace_of(source: str, catalog):
    from clustersim.analysis.config import config_path, read_yaml
    from clustersim.analysis.traces.workload import is_trace_workload, trace_config_from_mapping
    from clustersim.workloads.builder import build_trace
    from clustersim.workloads.trace_io import load_trace
    path = Path(source)
    if path.suffix == ".json":
        return load_trace(path)
    path = config_path(source)
    data = read_yaml(path)
    if is_trace_workload(data):
        return trace_config_from_mapping(data, path.parent, catalog).trace
    return build_trace(load_checked_config(path, catalog).job)


def run_export(args: argparse.Namespace) -> int:
    from clustersim.workloads.trace_import.chakra_export import export_chakra
    trace = _trace_of(args.source, args.catalog)
    written = export_chakra(trace, Path(args.out), args.stem, args.every_rank)
    print(f"wrote {len(written)} Chakra JSON file(s) to {args.out} "
          f"({written[0].name}{' ...' if len(written) > 1 else ''})")
    return 0


def run_record(args: argparse.Namespace) -> int:
    from clustersim.analysis.calibration.compare import (
        CALIBRATION_MODEL, CALIBRATION_TRAINING, calibration_config, parse_strategy,
    )
    from clustersim.analysis.calibration.record import record
    try:
        import torch  # noqa: F401
    except ImportError:
        from clustersim.hardware_specs import SpecError
        raise SpecError("trace record", "needs torch: pip install 'clustersim[calibrate]'") \
            from None
    model = dict(CALIBRATION_MODEL)
    if args.hidden:
        model["hidden"] = args.hidden
    training = dict(CALIBRATION_TRAINING)
    if args.global_batch:
        training["global_batch"] = args.global_batch
    config = calibration_config(parse_strategy(args.strategy), "cpu-core", model=model,
                                training=training)
    result = record(config.job, Path(args.out), warmup=args.warmup, pairs=args.pairs,
                    device=args.device)
    print(f"{args.strategy}: measured step {result['measured_step_time_s'] * 1e3:.1f} ms "
          f"(median of {len(result['untraced_steps_s'])} untraced steps), traced step "
          f"{result['traced_steps_s'][result['traced_step_kept']] * 1e3:.1f} ms; wrote {args.out}", file=sys.stdout)
    return 0


def simulate_trace_workload(args: argparse.Namespace) -> bool:
    """``clustersim simulate CONFIG`` when CONFIG's workload is a trace; False otherwise."""
    from clustersim.analysis.config import config_path, read_yaml
    from clustersim.analysis.traces.workload import (
        is_trace_workload, simulate_trace_config, trace_config_from_mapping, trace_summary,
    )
    if not args.config:
        return False
    path = config_path(args.config)
    data = read_yaml(path)
    if not is_trace_workload(data):
        return False
    config = trace_config_from_mapping(data, path.parent, args.catalog)
    config = replace(config, name=config.name or path.stem)
    result = simulate_trace_config(config)
    print(trace_summary(config, result))
    if args.json:
        out = {"name": config.name, "workload": "trace", "recorded_on": config.recorded_on,
               "world_size": config.trace.world_size, "source": config.trace.meta.get("source"),
               "warnings": list(config.warnings)}
        out.update(result.to_dict())
        write_json(out, args.json)
        print(f"\nwrote {args.json}")
    if args.trace:
        from clustersim.analysis.chrome_trace import write_chrome_trace
        write_chrome_trace(result, Path(args.trace), config.trace)
        print(f"wrote {args.trace}")
    return True
