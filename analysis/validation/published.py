"""``clustersim validate``: replay a table of published runs and compare step times.

The CSV schema (one row per real run): id, source, model_name, layers, hidden, ffn_hidden, heads,
kv_heads, vocab, mlp, norm (absent: layernorm), seq_len, global_batch, micro_batch, gpu, num_gpus, gpus_per_node, tp, pp,
dp, cp, ep, sequence_parallel, zero, recompute, virtual_stages, precision, measured_step_time_s,
step_time_basis, measured_peak_memory_gib, notes; optional: recompute_layers, attention,
zero3_granularity, zero3_prefetch, tp_comm_overlap, overlap_param_gather, fp8_recipe,
fp8_param_gather, fp8_saved_inputs, cross_entropy, compiled, eager_elementwise,
fp32_grad_reduce, pp_microbatch_buffers (absent: the software of the source's date, see
``software_of``; overlaps off; delayed FP8 scaling with 16-bit weights; FP8 inputs saved; eager
blocks saving what per-op recompute marks; fused element-wise kernels; what
a framework does differently, such as
torchtitan's FlashAttention-2 on Hopper and torchao's 16-bit saved inputs, is set in its rows'
columns with the evidence in ``notes``), ep_dispatcher (absent: alltoall), ep_dispatcher_sms
(the SMs DeepEP's or HybridEP's kernels hold, the recipe's ``moe_hybridep_num_sms``; absent:
the dispatcher's default), etp (absent: tp), cp_algorithm and cp_a2a (absent: ring), schedule (absent: 1f1b, or interleaved with virtual_stages > 1),
moe_a2a_overlap, account_for_embedding_in_pipeline_split and
account_for_loss_in_pipeline_split (absent: false), recompute_modules (with recompute
``modules``: Megatron-Core's module names separated by spaces), offload_activation_layers
(Megatron-Core's ``cpu_offloading_num_layers``; absent: 0), moe_paged_stash_buffer (absent:
no MoE paged stash; set: its CUDA buffer factor), capacity_factor (absent:
dropless; set: Megatron-Core's token-drop recipe, ``--moe-expert-capacity-factor`` with
``--moe-pad-expert-input-to-capacity``, every expert computing its full capacity),
router_balance (absent: uniform, what ``--moe-router-force-load-balancing`` draws; ``aux_loss``:
the recipe's natural routing under its auxiliary balance loss, ``workloads/routing.py``),
cuda_graphs (absent: full, host issue time not charged; ``none``: the recipe ran eager;
``moe_router``: Megatron's graphs scoped to moe_router and moe_preprocess; ``attn_moe_router``:
scoped to attn as well), mtp_layers (the multi-token-prediction modules the run trained,
Megatron-Core's ``mtp_num_layers``; absent: the model's own, DeepSeek-V3's config one; ``0``: a
run without MTP), and ``model``: a
preset or bundled Hugging Face config (MoE, MLA) that replaces the architecture columns. An
empty micro_batch means 1. Rows whose config does not fit in memory are reported apart; rows
that cannot be mapped (unknown GPU, an impossible strategy) are listed with the reason.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

from clustersim.hardware_specs import Catalog, SpecError
from clustersim.hardware_specs.fields import did_you_mean
from clustersim.hardware_specs.textfile import read_csv_rows
from clustersim.simulator import SimulationOptions
from clustersim.workloads import Job
from clustersim.workloads.memory import GIB
from clustersim.workloads.model import TransformerSpec, from_mapping
from clustersim.workloads.model_sources import resolve
from clustersim.workloads.strategy import strategy_from_mapping
from clustersim.workloads.training import training_from_mapping

from clustersim.analysis.accuracy import ERROR_MEANING, time_error
from clustersim.analysis.config import RunConfig, check_fp8_recipe, with_fp8_layouts
from clustersim.analysis.progress import progress as show_progress
from clustersim.analysis.step import run_step, DEFAULT_OPTIONS
from clustersim.analysis.tables import render

ARCHITECTURE = ("layers", "hidden", "heads", "vocab")
REQUIRED = ("id", *ARCHITECTURE, "seq_len", "global_batch", "gpu", "num_gpus", "tp", "pp", "dp",
            "measured_step_time_s")
SOFTWARE_COLUMNS = ("attention", "zero3_granularity", "zero3_prefetch")
"""Columns that override what ``software_of`` infers from the source's date."""
TRAINING_COLUMNS = ("fp8_recipe", "fp8_param_gather", "fp8_saved_inputs", "cross_entropy",
                    "compiled", "eager_elementwise", "fp32_grad_reduce", "pp_microbatch_buffers")
"""Columns passed to the training spec as written (absent: its defaults)."""
FLAG_COLUMNS = ("sequence_parallel", "tp_comm_overlap", "overlap_param_gather", "moe_a2a_overlap",
                "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")
"""Strategy switches (absent: false)."""
COLUMNS = frozenset((*REQUIRED, *SOFTWARE_COLUMNS, *TRAINING_COLUMNS, *FLAG_COLUMNS,
                     "source", "notes", "step_time_basis", "measured_peak_memory_gib", "model",
                     "model_name", "moe", "ffn_hidden", "kv_heads", "mlp", "norm", "micro_batch",
                     "node",
                     "gpus_per_node", "cp", "ep", "etp", "zero", "recompute", "recompute_layers",
                     "recompute_modules", "layers_per_stage", "virtual_stages", "schedule",
                     "precision", "ep_dispatcher", "ep_dispatcher_sms", "cp_algorithm", "cp_a2a",
                     "capacity_factor", "offload_activation_layers", "moe_paged_stash_buffer",
                     "router_balance", "cuda_graphs", "mtp_layers"))
"""Every column a table may have (the module docstring says what each means); another is a
typo that would otherwise be ignored."""


@dataclass(frozen=True)
class RowOutcome:
    id: str
    measured_s: float
    predicted_s: float | None = None
    fits: bool = True
    problem: str = ""
    mfu: float | None = None
    measured_peak_gib: float | None = None
    """The source's peak memory per GPU (torchtitan logs the caching allocator's
    ``max_memory_reserved``, the largest over GPUs), where it prints one."""
    predicted_peak_gib: float | None = None
    """The largest stage's caching-allocator reserve (``MemoryBreakdown.allocator_reserved``):
    live tensors and fragmentation, without the CUDA context and NCCL's buffers, as measured."""

    @property
    def error(self) -> float | None:
        """Signed fraction, predicted / measured - 1 (``analysis.accuracy``)."""
        if self.predicted_s is None:
            return None
        return time_error(self.predicted_s, self.measured_s)

    @property
    def peak_memory_error(self) -> float | None:
        """Signed fraction, predicted / measured peak memory - 1 (None without both)."""
        if self.measured_peak_gib is None or self.predicted_peak_gib is None:
            return None
        return self.predicted_peak_gib / self.measured_peak_gib - 1.0

    def to_dict(self) -> dict:
        return {"id": self.id, "measured_step_time_s": self.measured_s,
                "predicted_step_time_s": self.predicted_s, "error": self.error,
                "fits_in_memory": self.fits, "problem": self.problem, "mfu": self.mfu,
                "measured_peak_memory_gib": self.measured_peak_gib,
                "predicted_peak_memory_gib": self.predicted_peak_gib,
                "peak_memory_error": self.peak_memory_error}


FLASH_ATTENTION = (2022, 5, 14135)
"""FlashAttention (Dao et al., arXiv 2205.14135): runs before it used unfused attention."""
FLASH_ATTENTION_3 = (2024, 7, 8608)
"""FlashAttention-3 (Shah et al., arXiv 2407.08608): Hopper runs published after it use
FlashAttention-3-class kernels (FA3; Transformer Engine's cuDNN fused attention) unless the row's
``attention`` column says otherwise (torchtitan's PyTorch SDPA runs FlashAttention-2 on Hopper
until torchtitan 6a3a9da, 2025-10-09: its rows set ``attention: flash``; the PyTorch 2.5
nightlies of August 2024 put cuDNN first on H100 themselves, until pytorch/pytorch#138522:
``attention: cudnn_2024``)."""
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
    when the source was published; otherwise today's defaults. Only the date is read from the
    source: what one framework does differently is a column of its rows."""
    date = publication_date(_cell(row, "source"))
    out = {}
    if date is not None and date < FLASH_ATTENTION:
        out["attention"] = "standard"
    elif date is not None and date >= FLASH_ATTENTION_3:
        out["attention"] = "flash3"
    if date is not None and date < PYTORCH_FSDP:
        out["zero3_granularity"] = "tensor"
        out["zero3_prefetch"] = "none"
    for key in SOFTWARE_COLUMNS:
        if _cell(row, key):
            out[key] = _cell(row, key)
    return out


def _cell(row: dict, key: str, default: str = "") -> str:
    value = (row.get(key) or "").strip()
    return value if value else default


def _int(row: dict, key: str, default: int | None = None) -> int:
    text = _cell(row, key)
    if not text and default is not None:
        return default
    try:
        return int(text)
    except ValueError:
        raise SpecError(key, f"expected a whole number, got {text!r}") from None


def _ints(row: dict, key: str) -> list[int]:
    """A cell of whole numbers separated by spaces (empty: none)."""
    try:
        return [int(word) for word in _cell(row, key).split()]
    except ValueError:
        raise SpecError(key, f"expected whole numbers separated by spaces, "
                             f"got {_cell(row, key)!r}") from None


def _measured_peak(row: dict) -> float | None:
    """The ``measured_peak_memory_gib`` column: None when empty."""
    if not _cell(row, "measured_peak_memory_gib"):
        return None
    return _positive(row, "measured_peak_memory_gib", "GiB or nothing")


def _measured(row: dict) -> float:
    return _positive(row, "measured_step_time_s", "seconds")


def _positive(row: dict, key: str, unit: str) -> float:
    text = _cell(row, key)
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise SpecError(key, f"expected a positive number of {unit}, got {text!r}")
    return value


def _model(row: dict) -> TransformerSpec:
    """The ``model`` column's preset or bundled config (MoE and MLA models), else the
    architecture columns; ``mtp_layers`` replaces the MTP depth the model's config gives (a
    published run may train a model without its multi-token-prediction module)."""
    model = _architecture(row)
    if not _cell(row, "mtp_layers"):
        return model
    depth = _int(row, "mtp_layers")
    if depth < 0:
        raise SpecError("mtp_layers", f"expected 0 or more modules, got {depth}")
    return replace(model, mtp_layers=depth)


def _architecture(row: dict) -> TransformerSpec:
    if _cell(row, "model"):
        return resolve(_cell(row, "model"), path="model")
    heads = _int(row, "heads")
    return from_mapping({
        "name": _cell(row, "model_name", "model"),
        "layers": _int(row, "layers"), "hidden": _int(row, "hidden"),
        "heads": heads, "kv_heads": _int(row, "kv_heads", heads),
        "ffn_hidden": _int(row, "ffn_hidden", 4 * _int(row, "hidden")),
        "vocab": _int(row, "vocab"), "mlp": _cell(row, "mlp", "gelu"),
        "norm": _cell(row, "norm", "layernorm"),
    })


def _moe_routing(row: dict) -> dict:
    """The ``moe`` routing of a row: its router's balance, and for a ``capacity_factor`` row
    Megatron-Bridge's token-drop recipe (``apply_moe_token_drop``), which pads every expert's
    input to its capacity."""
    moe = {"balance": _cell(row, "router_balance")} if _cell(row, "router_balance") else {}
    if _cell(row, "capacity_factor"):
        moe |= {"capacity_factor": _positive(row, "capacity_factor",
                                             "balanced shares an expert keeps"),
                "pad_to_capacity": True}
    return {"moe": moe} if moe else {}


def row_config(row: dict, catalog: Catalog) -> RunConfig:
    """The run config a CSV row describes."""
    named = bool(_cell(row, "model"))
    missing = [k for k in REQUIRED if not _cell(row, k) and not (named and k in ARCHITECTURE)]
    if missing:
        raise SpecError(missing[0], "is empty")
    software = software_of(row)
    model = _model(row)
    training = training_from_mapping({
        "seq_len": _int(row, "seq_len"), "global_batch": _int(row, "global_batch"),
        "micro_batch": _int(row, "micro_batch", 1),
        "precision": _cell(row, "precision", "bf16"),
        "attention": software.get("attention", "flash"),
        **{key: _cell(row, key) for key in TRAINING_COLUMNS if _cell(row, key)},
        **_moe_routing(row),
    })
    v = _int(row, "virtual_stages", 1)
    strategy = strategy_from_mapping({
        "tp": _int(row, "tp"), "pp": _int(row, "pp"), "dp": _int(row, "dp"),
        "cp": _int(row, "cp", 1), "ep": _int(row, "ep", 1),
        **{flag: _cell(row, flag, "false") for flag in FLAG_COLUMNS},
        "ep_dispatcher": _cell(row, "ep_dispatcher", "alltoall"), "etp": _int(row, "etp", 0),
        "ep_dispatcher_sms": _int(row, "ep_dispatcher_sms", 0),
        "cuda_graphs": _cell(row, "cuda_graphs", "full"),
        "cp_algorithm": _cell(row, "cp_algorithm", "ring"), "cp_a2a": _int(row, "cp_a2a", 0),
        "zero": _int(row, "zero", 0), "recompute": _cell(row, "recompute", "none"),
        "recompute_layers": _int(row, "recompute_layers", 0),
        "offload_activation_layers": _int(row, "offload_activation_layers", 0),
        "moe_paged_stash_buffer": (_positive(row, "moe_paged_stash_buffer", "balanced shares")
                                   if _cell(row, "moe_paged_stash_buffer") else 0.0),
        "recompute_modules": _cell(row, "recompute_modules").split(),
        "layers_per_stage": _ints(row, "layers_per_stage"),
        "virtual_stages": v,
        "schedule": _cell(row, "schedule", "interleaved" if v > 1 else "1f1b"),
        **{k: software[k] for k in ("zero3_granularity", "zero3_prefetch") if k in software},
    })
    gpus = _int(row, "num_gpus")
    per_node = _cell(row, "gpus_per_node")
    cluster = catalog.cluster(device=_cell(row, "gpu"), num_devices=gpus,
                              node=_cell(row, "node") or None,
                              devices_per_node=_int(row, "gpus_per_node") if per_node else None,
                              keep_together=strategy.tp * strategy.cp * strategy.ep)
    job = Job(model, training, strategy).checked(gpus)
    check_fp8_recipe(job, cluster, "fp8_recipe")
    job = with_fp8_layouts(job, cluster)
    return RunConfig(job=job, cluster=cluster, catalog=catalog, name=_cell(row, "id"))


def validate_rows(path: Path, catalog: Catalog, options: SimulationOptions = DEFAULT_OPTIONS,
                  progress: bool | None = False) -> list[RowOutcome]:
    """Every run of the table, simulated; ``progress`` as ``analysis.progress`` takes it."""
    rows = read_csv_rows(path, "--runs")
    if not rows:
        raise SpecError("--runs", f"{path} has no runs (expected a header and one row per run)")
    if "measured_step_time_s" not in rows[0]:
        raise SpecError("--runs", f"{path} lacks the measured_step_time_s column")
    longer = next((i for i, row in enumerate(rows) if None in row), None)
    if longer is not None:           # csv.DictReader files the extra cells under None
        raise SpecError("--runs", f"{path}: line {longer + 2} has more cells than the header")
    shorter = next((i for i, row in enumerate(rows) if None in row.values()), None)
    if shorter is not None:          # ... and a missing cell as None
        cells = sum(value is not None for value in rows[shorter].values())
        raise SpecError("--runs", f"{path}: line {shorter + 2} has {cells} cells; the header "
                                  f"has {len(rows[shorter])}")
    unknown = [column for column in rows[0] if column not in COLUMNS]
    if unknown:
        raise SpecError("--runs", f"{path}: unknown column {unknown[0]!r}"
                                  f"{did_you_mean(str(unknown[0]), COLUMNS)}")
    _check_columns_and_ids(path, rows)
    outcomes = []
    bar = show_progress(len(rows), "validate", "run", progress)
    for row in rows:
        outcomes.append(_outcome(row, catalog, options))
        bar.update(1)
    bar.close()
    return outcomes


def _check_columns_and_ids(path: Path, rows: list[dict]) -> None:
    """A required column absent from the header fails every row the same way, and two rows
    of one ``id`` make the report ambiguous: both are the table's error, said once."""
    header = rows[0]
    absent = [k for k in REQUIRED if k not in header and not ("model" in header
                                                                and k in ARCHITECTURE)]
    if absent:
        needs = " (or a model column naming a preset)" if absent[0] in ARCHITECTURE else ""
        raise SpecError("--runs", f"{path} lacks the {absent[0]} column{needs}")
    first_line: dict[str, int] = {}
    for line, row in enumerate(rows, start=2):
        rid = _cell(row, "id")
        if rid in first_line:
            raise SpecError("--runs", f"{path}: line {line}: id {rid!r} is already the run "
                                      f"of line {first_line[rid]}")
        if rid:
            first_line[rid] = line


def _outcome(row: dict, catalog: Catalog, options: SimulationOptions) -> RowOutcome:
    rid = _cell(row, "id", "?")
    try:
        measured = _measured(row)
        measured_peak = _measured_peak(row)
        config = row_config(row, catalog)
    except SpecError as err:
        return RowOutcome(rid, math.nan, problem=str(_as_column(err, row)))
    except ValueError as err:
        return RowOutcome(rid, math.nan, problem=str(err))
    report = run_step(config, options=options)
    reserved = max(s.memory.allocator_reserved for s in report.memory) / GIB
    return RowOutcome(rid, measured, report.result.step_time_s, report.result.fits_in_memory,
                      mfu=report.result.mfu, measured_peak_gib=measured_peak,
                      predicted_peak_gib=reserved)


def _as_column(err: SpecError, row: dict) -> SpecError:
    """The error with the table's column for its field: ``precision`` where the run config
    it was read into says ``training.precision``."""
    section, _, key = err.field.partition(".")
    if section in ("training", "strategy", "cluster") and key in row:
        return SpecError(key, err.message)
    return err


@dataclass(frozen=True)
class ValidationSummary:
    rows: int
    compared: int
    mape: float
    max_abs_error: float
    not_fitting: int
    unmapped: int
    peak_memory_compared: int = 0
    """Rows with a measured peak memory (fitting or not: memory is predicted either way)."""
    peak_memory_mape: float = math.nan
    peak_memory_max_abs_error: float = math.nan

    def to_dict(self) -> dict:
        """Plain values; a statistic with nothing to average is None (valid JSON)."""
        return {k: None if isinstance(v, float) and math.isnan(v) else v
                for k, v in self.__dict__.items()}


def summarize(outcomes: list[RowOutcome]) -> ValidationSummary:
    fitted = [o for o in outcomes if o.error is not None and o.fits]
    errors = [abs(o.error) for o in fitted]
    memory = [abs(o.peak_memory_error) for o in outcomes if o.peak_memory_error is not None]
    return ValidationSummary(
        rows=len(outcomes), compared=len(fitted),
        mape=sum(errors) / len(errors) if errors else math.nan,
        max_abs_error=max(errors) if errors else math.nan,
        not_fitting=sum(1 for o in outcomes if o.error is not None and not o.fits),
        unmapped=sum(1 for o in outcomes if o.error is None),
        peak_memory_compared=len(memory),
        peak_memory_mape=sum(memory) / len(memory) if memory else math.nan,
        peak_memory_max_abs_error=max(memory) if memory else math.nan)


def render_outcomes(outcomes: list[RowOutcome]) -> str:
    """The table; with peak-memory columns when some row has a measured peak."""
    memory = any(o.measured_peak_gib is not None for o in outcomes)
    rows = []
    for o in outcomes:
        if o.error is None:
            row = [o.id, "-", "-", "-", "-"] + (["-"] * 3 if memory else [])
            rows.append(row + [f"not mapped: {o.problem}"])
            continue
        row = [o.id, f"{o.measured_s:.3f}", f"{o.predicted_s:.3f}", f"{100 * o.error:+.1f}%",
               f"{100 * o.mfu:.1f}%"]
        if memory:
            known = o.peak_memory_error is not None
            row += [f"{o.measured_peak_gib:.1f}" if known else "",
                    f"{o.predicted_peak_gib:.1f}",
                    f"{100 * o.peak_memory_error:+.1f}%" if known else ""]
        rows.append(row + ["" if o.fits else "does not fit in memory"])
    s = summarize(outcomes)
    headers = ["run", "measured s", "predicted s", "error", "MFU"]
    if memory:
        headers += ["peak GiB", "predicted GiB", "mem error"]
    table = render(headers + ["note"], rows)
    accuracy = (f"MAPE {100 * s.mape:.2f}%, max |error| {100 * s.max_abs_error:.1f}%"
                if s.compared else "no accuracy to report")
    tail = (f"\n\n{ERROR_MEANING}\n{s.compared} runs compared: {accuracy}; {s.not_fitting} do not "
            f"fit in memory; {s.unmapped} not mapped")
    if s.peak_memory_compared:
        tail += (f"\npeak memory (the caching allocator's reserve, predicted / measured - 1) on "
                 f"{s.peak_memory_compared} runs: mean |error| {100 * s.peak_memory_mape:.1f}%, "
                 f"max {100 * s.peak_memory_max_abs_error:.1f}%")
    return table + tail
