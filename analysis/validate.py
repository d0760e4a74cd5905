"""``clustersim validate``: replay a table of published runs and compare step times.

The CSV schema (one row per real run): id, source, model_name, layers, hidden, ffn_hidden, heads,
kv_heads, vocab, mlp, seq_len, global_batch, micro_batch, gpu, num_gpus, gpus_per_node, tp, pp,
dp, cp, ep, sequence_parallel, zero, recompute, virtual_stages, precision, measured_step_time_s,
step_time_basis, measured_peak_memory_gib, notes. An empty micro_batch means 1. Rows whose
config does not fit in memory are reported apart; rows that cannot be mapped (unknown GPU, an
impossible strategy) are listed with the reason.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

from hardware_specs import Catalog, SpecError
from simulator import SimulationOptions
from workloads import Job
from workloads.model import from_mapping
from workloads.strategy import strategy_from_mapping
from workloads.training import training_from_mapping

from analysis.cli_common import add_catalog_option, write_json
from analysis.config import RunConfig
from analysis.step import run_step, DEFAULT_OPTIONS
from analysis.tables import render

REQUIRED = ("id", "layers", "hidden", "heads", "vocab", "seq_len", "global_batch", "gpu",
            "num_gpus", "tp", "pp", "dp", "measured_step_time_s")


@dataclass(frozen=True)
class RowOutcome:
    id: str
    measured_s: float
    predicted_s: float | None = None
    fits: bool = True
    problem: str = ""
    mfu: float | None = None

    @property
    def error(self) -> float | None:
        """Signed fraction: (predicted - measured) / measured."""
        if self.predicted_s is None:
            return None
        return (self.predicted_s - self.measured_s) / self.measured_s

    def to_dict(self) -> dict:
        return {"id": self.id, "measured_step_time_s": self.measured_s,
                "predicted_step_time_s": self.predicted_s, "error": self.error,
                "fits_in_memory": self.fits, "problem": self.problem, "mfu": self.mfu}


FLASH_ATTENTION = (2022, 5, 14135)
"""FlashAttention (Dao et al., arXiv 2205.14135): runs before it used unfused attention."""
PYTORCH_FSDP = (2022, 3, 0)
"""PyTorch FSDP (1.11, March 2022): before it, ZeRO-3 meant DeepSpeed's implementation, which
gathered each parameter tensor with its own collective and, in published runs (Narayanan et
al. SC'21 Table 2), did not hide the gathers behind compute."""


def publication_date(source: str) -> tuple[int, int, int] | None:
    """(year, month, arXiv sequence number) of a source string: from an arXiv id (``arXiv
    2104.04473``: papers of one month are ordered by that number), else from a year (``2021``,
    ``SC'21``), taken as its January."""
    arxiv = re.search(r"arXiv[: ]*(\d{2})(\d{2})\.(\d{4,5})", source)
    if arxiv:
        return 2000 + int(arxiv.group(1)), int(arxiv.group(2)), int(arxiv.group(3))
    years = [int(y) for y in re.findall(r"\b(20\d{2})\b", source)]
    years += [2000 + int(y) for y in re.findall(r"'(\d{2})\b", source)]
    return (max(years), 1, 0) if years else None


def software_of(row: dict) -> dict:
    """The software a published run used, where the table does not say: explicit columns
    (``attention``, ``zero3_granularity``, ``zero3_prefetch``) win; otherwise what existed
    when the source was published; otherwise today's defaults."""
    date = publication_date(_cell(row, "source"))
    out = {}
    if date is not None and date < FLASH_ATTENTION:
        out["attention"] = "standard"
    if date is not None and date < PYTORCH_FSDP:
        out["zero3_granularity"] = "tensor"
        out["zero3_prefetch"] = "none"
    for key in ("attention", "zero3_granularity", "zero3_prefetch"):
        if _cell(row, key):
            out[key] = _cell(row, key)
    return out


def _cell(row: dict, key: str, default: str = "") -> str:
    value = (row.get(key) or "").strip()
    return value if value else default


def row_config(row: dict, catalog: Catalog) -> RunConfig:
    """The run config a CSV row describes."""
    missing = [k for k in REQUIRED if not _cell(row, k)]
    if missing:
        raise SpecError(missing[0], "is empty")
    heads = int(_cell(row, "heads"))
    software = software_of(row)
    model = from_mapping({
        "name": _cell(row, "model_name", "model"),
        "layers": int(_cell(row, "layers")), "hidden": int(_cell(row, "hidden")),
        "heads": heads, "kv_heads": int(_cell(row, "kv_heads", str(heads))),
        "ffn_hidden": int(_cell(row, "ffn_hidden", str(4 * int(_cell(row, "hidden"))))),
        "vocab": int(_cell(row, "vocab")), "mlp": _cell(row, "mlp", "gelu"),
    })
    training = training_from_mapping({
        "seq_len": int(_cell(row, "seq_len")), "global_batch": int(_cell(row, "global_batch")),
        "micro_batch": int(_cell(row, "micro_batch", "1")),
        "precision": _cell(row, "precision", "bf16"),
        "attention": software.get("attention", "flash"),
    })
    v = int(_cell(row, "virtual_stages", "1"))
    strategy = strategy_from_mapping({
        "tp": int(_cell(row, "tp")), "pp": int(_cell(row, "pp")), "dp": int(_cell(row, "dp")),
        "cp": int(_cell(row, "cp", "1")), "ep": int(_cell(row, "ep", "1")),
        "sequence_parallel": _cell(row, "sequence_parallel", "false").lower() == "true",
        "zero": int(_cell(row, "zero", "0")), "recompute": _cell(row, "recompute", "none"),
        "virtual_stages": v, "schedule": "interleaved" if v > 1 else "1f1b",
        **{k: software[k] for k in ("zero3_granularity", "zero3_prefetch") if k in software},
    })
    gpus = int(_cell(row, "num_gpus"))
    per_node = _cell(row, "gpus_per_node")
    cluster = catalog.cluster(device=_cell(row, "gpu"), num_devices=gpus,
                              devices_per_node=int(per_node) if per_node else None)
    job = Job(model, training, strategy).checked(gpus)
    return RunConfig(job=job, cluster=cluster, catalog=catalog, name=_cell(row, "id"))


def validate_rows(path: Path, catalog: Catalog,
                  options: SimulationOptions = DEFAULT_OPTIONS) -> list[RowOutcome]:
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    if rows and "measured_step_time_s" not in rows[0]:
        raise SpecError("--runs", f"{path} lacks the measured_step_time_s column")
    outcomes = []
    for row in rows:
        rid = _cell(row, "id", "?")
        try:
            measured = float(_cell(row, "measured_step_time_s"))
            config = row_config(row, catalog)
        except (SpecError, ValueError) as err:
            outcomes.append(RowOutcome(rid, math.nan, problem=str(err)))
            continue
        report = run_step(config, options=options)
        outcomes.append(RowOutcome(rid, measured, report.result.step_time_s,
                                   report.result.fits_in_memory, mfu=report.result.mfu))
    return outcomes


@dataclass(frozen=True)
class ValidationSummary:
    rows: int
    compared: int
    mape: float
    max_abs_error: float
    not_fitting: int
    unmapped: int

    def to_dict(self) -> dict:
        return self.__dict__.copy()


def summarize(outcomes: list[RowOutcome]) -> ValidationSummary:
    fitted = [o for o in outcomes if o.error is not None and o.fits]
    errors = [abs(o.error) for o in fitted]
    return ValidationSummary(
        rows=len(outcomes), compared=len(fitted),
        mape=sum(errors) / len(errors) if errors else math.nan,
        max_abs_error=max(errors) if errors else math.nan,
        not_fitting=sum(1 for o in outcomes if o.error is not None and not o.fits),
        unmapped=sum(1 for o in outcomes if o.error is None))


def render_outcomes(outcomes: list[RowOutcome]) -> str:
    rows = []
    for o in outcomes:
        if o.error is None:
            rows.append([o.id, "-", "-", "-", "-", f"not mapped: {o.problem}"])
        else:
            note = "" if o.fits else "does not fit in memory"
            rows.append([o.id, f"{o.measured_s:.3f}", f"{o.predicted_s:.3f}",
                         f"{100 * o.error:+.1f}%", f"{100 * o.mfu:.1f}%", note])
    s = summarize(outcomes)
    table = render(["run", "measured s", "predicted s", "error", "MFU", "note"], rows)
    tail = (f"\n\n{s.compared} runs compared: MAPE {100 * s.mape:.2f}%, max |error| "
            f"{100 * s.max_abs_error:.1f}%; {s.not_fitting} do not fit in memory; "
            f"{s.unmapped} not mapped")
    return table + tail


def register(sub) -> None:
    p = sub.add_parser("validate", help="compare predictions with published runs")
    p.add_argument("--runs", required=True, metavar="FILE.csv", help="published-runs table")
    p.add_argument("--json", metavar="OUT", help="write rows and summary as JSON")
    add_catalog_option(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from hardware_specs import load_catalog

    path = Path(args.runs)
    if not path.exists():
        raise SpecError("--runs", f"no such file: {path}")
    outcomes = validate_rows(path, load_catalog(args.catalog))
    print(render_outcomes(outcomes))
    if args.json:
        write_json({"summary": summarize(outcomes).to_dict(),
                    "rows": [o.to_dict() for o in outcomes]}, args.json)
        print(f"\nwrote {args.json}")
    return 0
