"""Accuracy on the bundled published runs (analysis/data/published_runs_dev.csv)."""

import csv

import pytest

from clustersim.analysis.validation.published import publication_date, software_of, summarize, validate_rows

from tests.conftest import REPO

RUNS = REPO / "analysis/data/published_runs_dev.csv"


def test_bundled_runs_keep_their_provenance():
    rows = list(csv.DictReader(RUNS.open()))
    assert len(rows) == 77
    assert all(r["source"] and r["measured_step_time_s"] for r in rows)


@pytest.mark.parametrize("source, date", [
    ("Narayanan et al. (SC'21, arXiv 2104.04473)", (2021, 4, 4473)),
    ("Korthikanti et al. 2022, arXiv 2205.05198", (2022, 5, 5198)),
    ("mosaicml/llm-foundry benchmarking README", None),
    ("BLOOM, 2022", (2022, 1, 0)),
])
def test_publication_dates(source, date):
    assert publication_date(source) == date


def test_software_era_follows_the_source_date():
    old = software_of({"source": "arXiv 2104.04473"})
    assert old == {"attention": "standard", "zero3_granularity": "tensor", "zero3_prefetch": "none"}
    assert software_of({"source": "mosaicml/llm-foundry, 2023"}) == {}
    # After FlashAttention-3 (2407.08608): FA3-class kernels (cuDNN SDPA, TE, FA3).
    assert software_of({"source": "arXiv 2407.21783"}) == {"attention": "flash3"}
    # Same month as FlashAttention (2205.14135), but before it.
    assert software_of({"source": "arXiv 2205.05198"})["attention"] == "standard"
    assert software_of({"source": "arXiv 2104.04473", "attention": "flash"})["attention"] == "flash"


def test_software_of_reads_only_the_date_from_the_source():
    """What one framework does differently is a column of its rows, never a name in the source:
    a torchtitan FP8 row on Hopper dated 2025-06 gets the era's defaults, like any other."""
    row = {"source": "pytorch/torchtitan benchmarks (2025-06)", "gpu": "h100-sxm",
           "precision": "fp8"}
    assert software_of(row) == software_of({**row, "source": "some stack (2025-06)"}) == \
        {"attention": "flash3"}
    assert software_of({**row, "attention": "flash"}) == {"attention": "flash"}


TORCHTITAN_TABLES = ("published_runs_torchtitan.csv", "published_runs_long_context.csv")


@pytest.mark.parametrize("table", TORCHTITAN_TABLES)
def test_torchtitan_rows_state_their_framework_facts(table):
    """torchtitan's rows say in columns, with the evidence in their notes, what differs from the
    defaults: PyTorch SDPA's FlashAttention-2 (``attention: flash``; cuDNN first on Hopper only
    from torchtitan 6a3a9da, 2025-10-09) except where the PyTorch 2.5 nightlies put cuDNN first
    on H100 themselves (``attention: cudnn_2024``, until pytorch/pytorch#138522 made it opt-in),
    torchao's float8 keeping 16-bit linear inputs (``fp8_saved_inputs: false``), its eager FP32
    loss and FP32 gradient reduction."""
    rows = [r for r in csv.DictReader((REPO / "analysis/data" / table).open())
            if "torchtitan" in r["source"].lower()]
    assert rows
    for r in rows:
        if r["attention"] == "cudnn_2024":
            assert "attention: cuDNN" in r["notes"] and "pytorch/pytorch#138522" in r["notes"], \
                r["id"]
        else:
            assert r["attention"] == "flash" and "FlashAttention-2" in r["notes"], r["id"]
        assert r["cross_entropy"] in ("eager_fp32", "compiled_fp32"), r["id"]
        assert r["fp32_grad_reduce"] == "true", r["id"]
        compiled_loss = r["cross_entropy"] == "compiled_fp32"
        assert ("cross_entropy: compiled_fp32: torchtitan" in r["notes"]) == compiled_loss, r["id"]
        if r.get("compiled"):
            assert "compiled: true" in r["notes"], r["id"]
        if r.get("eager_elementwise"):
            assert not r.get("compiled") and "eager_elementwise: true" in r["notes"], r["id"]
        fp8 = r["precision"] == "fp8"
        assert r["fp8_saved_inputs"] == ("false" if fp8 else ""), r["id"]
        assert ("fp8_saved_inputs: false: torchao" in r["notes"]) == fp8, r["id"]


@pytest.mark.slow
def test_dev_set_mape_is_at_most_ten_percent(catalog):
    outcomes = validate_rows(RUNS, catalog)
    summary = summarize(outcomes)
    assert summary.unmapped == 0
    assert summary.compared >= 70
    assert summary.mape <= 0.10


LLAMA2_70B_OP = "torchtitan-llama2-70b-64g-a100-selective-op"


@pytest.mark.slow
def test_torchtitan_fsdp2_runs_outside_the_dev_set_within_ten_percent(catalog):
    """torchtitan's published FSDP2 throughput on 64 A100 (Llama 2 13B without recompute,
    recomputing every other layer and with per-op recompute, Llama 2 and 3 70B with full
    recompute, Llama 3 8B recomputing every other layer and with per-op recompute), never used
    to develop the model; the per-op and 13B every-other-layer rows were predicted before they
    were added (+0.0%, -6.8%, -2.8%)."""
    outcomes = validate_rows(REPO / "analysis/data/published_runs_torchtitan.csv", catalog)
    a100 = [o for o in outcomes if "-a100-" in o.id and o.id != LLAMA2_70B_OP]
    assert len(a100) == 7
    for o in a100:
        assert abs(o.error) <= 0.10, o


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="Llama 2 70B with per-op recompute at local batch 1 runs "
                   "at the same MFU as full recompute at batch 2 (50.8% and 50.5%); predicted "
                   "12.6% fast. The source notes that batch 2 runs out of memory with selective "
                   "AC, so batch 1 runs near the 80 GB capacity, where the caching allocator's "
                   "retries may cost time; nothing we found measures that cost")
def test_torchtitan_llama2_70b_per_op_recompute_within_ten_percent(catalog):
    outcomes = validate_rows(REPO / "analysis/data/published_runs_torchtitan.csv", catalog)
    (row,) = [o for o in outcomes if o.id == LLAMA2_70B_OP]
    assert abs(row.error) <= 0.10, row


TT_FILE = REPO / "analysis/data/published_runs_torchtitan.csv"


@pytest.mark.slow
def test_torchtitan_file_within_ten_percent_and_vanilla_tp_h100_rows_within_five(catalog):
    """Issue 15's bar for torchtitan (MAPE at most 10%, every row runnable); and the three 70B
    FSDP 32 x TP 8 rows without async TP or pipelining (float8 2024-12, BF16 and float8 2025-06),
    whose step is GEMMs, SDPA's FlashAttention-2 and exposed TP collectives, within 5% (they came
    out 14-17% fast with FlashAttention-3-class attention)."""
    outcomes = validate_rows(TT_FILE, catalog)
    summary = summarize(outcomes)
    assert (summary.rows, summary.compared, summary.unmapped) == (27, 27, 0)
    assert summary.mape <= 0.10
    vanilla = [o for o in outcomes
               if "_h100_" in o.id and "_70b_" in o.id and "_2d_" in o.id and "async" not in o.id]
    assert len(vanilla) == 3
    for o in vanilla:
        assert abs(o.error) <= 0.05, o


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="torchtitan's BF16 async-TP row comes out 10% fast and "
                   "the 405B PP 8 rows 11-14% fast: they ran on Grand Teton H100 96GB HBM2e at a "
                   "500 W power limit, whose sustained clocks are not published ('the actual peak "
                   "TFLOPs number is between SXM and NVL, and we don't know its exact value'; the "
                   "catalog's h100-hbm2e-500w keeps the 700 W rates), and async TP's measured gain "
                   "differs between releases (float8: 1.06x in 2024-12, 1.16x in 2025-06) where "
                   "the model gives both 1.16x. The 405B FSDP 16 x TP 8 rows of 2024-08 (docs/"
                   "performance.md) come out 17.6% (BF16) and 14.9% (float8 + async TP) fast on "
                   "the same parts, float8 9.4%; their attention (cuDNN through the 2.5 "
                   "nightlies' SDPA, cudnn_2024) is inferred, the nightly is not named, and "
                   "float8's measured gain (1.62x) and async TP's (1.05x) are not the model's "
                   "(1.48x, 1.11x)")
def test_torchtitan_h100_runs_within_ten_percent(catalog):
    """torchtitan's H100 runs: 2024-08 405B FSDP 16 x TP 8 (BF16, float8, float8 + async TP);
    2024-12 and 2025-06 70B FSDP 32 x TP 8 (BF16 and float8, vanilla and async TP) and 405B
    FSDP 8 x TP 8 x PP 8 (1F1B, interleaved); all runnable."""
    outcomes = validate_rows(TT_FILE, catalog)
    h100 = [o for o in outcomes if "_h100_" in o.id]
    assert len(h100) == 17 and all(o.predicted_s is not None for o in h100)
    for o in h100:
        assert abs(o.error) <= 0.10, o


H200_UNEXPLAINED = (
    "Trainy's H200 runs (Llama 3.1 8B, FSDP 32 and 64, local batch 2, per-op recompute, "
    "compile, float8 with float8 all-gather) come out 17.5% and 15.5% slow. The step is compute "
    "(0.02 s of exposed DP); SDPA's FlashAttention-2 is 0.73 s of the predicted 1.76 s (169 "
    "TFLOP/s: FA2's isolated 0.35 of peak times the Hopper in-training 0.52 calibrated on the "
    "MPT runs), GEMMs 0.85 s (float8 layers 0.76, the 16-bit LM head 0.09), element-wise 0.17 s; FA3-class attention would give "
    "-12%. The same recipe on Grand Teton H100 at 500 W (benchmarks/llama3_h100_202412_"
    "torchtitan.md Tables 1 and 3, 8,532 and 8,380 TPS/GPU) is predicted within 2.4%; the H200 "
    "ran 30% faster than those, the model gives 11% (HBM3e at 4.8 TB/s, the float8 all-gather). "
    "The rest lies between the 500 W power limit (whose clocks are not published; the catalog "
    "gives that part the 700 W rates) and the software of June 2025 (torch 2.8.0a0 of NGC "
    "25.05, torchao 0afa4c1); no source read measures either")


@pytest.mark.xfail(strict=True, reason=H200_UNEXPLAINED)
@pytest.mark.parametrize("row_id", ["torchtitan_h200_llama3.1_8b_32gpu_fsdp_fp8",
                                    "torchtitan_h200_llama3.1_8b_64gpu_fsdp_fp8"])
def test_torchtitan_h200_runs_within_ten_percent(catalog, row_id):
    from clustersim.analysis.step import run_step
    from clustersim.analysis.validation.published import row_config
    row = next(r for r in csv.DictReader(TT_FILE.open()) if r["id"] == row_id)
    predicted = run_step(row_config(row, catalog)).result.step_time_s
    error = predicted / float(row["measured_step_time_s"]) - 1
    assert abs(error) <= 0.10, f"{row_id}: {error:+.1%}"


def test_a_flag_column_that_is_not_true_or_false_names_the_field(catalog):
    from clustersim.hardware_specs import SpecError
    from clustersim.analysis.validation.published import row_config
    row = next(csv.DictReader(open(RUNS)))
    with pytest.raises(SpecError, match="strategy.tp_comm_overlap: expected true or false"):
        row_config(dict(row, tp_comm_overlap="yes"), catalog)


def _table(tmp_path, header: list[str], rows: list[list[str]]):
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as fh:
        csv.writer(fh).writerows([header, *rows])
    return path


@pytest.mark.parametrize("change, expected", [
    ({"precision": "fp7"}, "precision: expected one of fp32|fp16|bf16|fp8|nvfp4, got 'fp7'"),
    ({"gpu": "h100"}, "gpu: unknown device 'h100'; did you mean"),
    ({"recompute": "some"}, "recompute: expected one of none|selective|full|op|modules"),
])
def test_a_bad_cell_is_reported_under_its_column(catalog, tmp_path, change, expected):
    """The table's column (``precision``), not the run-config field it is read into
    (``training.precision``)."""
    row = next(csv.DictReader(open(RUNS)))
    path = _table(tmp_path, list(row), [list(dict(row, **change).values())])
    [outcome] = validate_rows(path, catalog)
    assert outcome.problem.startswith(expected)


@pytest.mark.parametrize("header, rows, expected", [
    (["id", "measured_step_time_s", "atention"], [["a", "1", "flash"]],
     "unknown column 'atention'; did you mean attention?"),
    (["id", "measured_step_time_s"], [["a", "1"], ["b", "1", "x"]],
     "line 3 has more cells than the header"),
    (["id", "measured_step_time_s"], [["a", "1"], ["b"]], "line 3 has 1 cells; the header has 2"),
])
def test_a_table_whose_columns_are_wrong_is_refused(catalog, tmp_path, header, rows, expected):
    """A misspelt column would otherwise be ignored and the row run with the default."""
    from clustersim.hardware_specs import SpecError
    with pytest.raises(SpecError, match=f"--runs: .*runs.csv: {expected}"):
        validate_rows(_table(tmp_path, header, rows), catalog)


def _dev_row_without(column: str) -> tuple[list[str], list[str]]:
    row = next(csv.DictReader(open(RUNS)))
    row.pop(column, None)
    return list(row), list(row.values())


@pytest.mark.parametrize("column, expected", [
    ("hidden", "lacks the hidden column \\(or a model column naming a preset\\)"),
    ("tp", "lacks the tp column$"),
])
def test_a_required_column_missing_from_the_header_names_it(catalog, tmp_path, column, expected):
    """Not ``hidden: is empty`` under every row: the table lacks the column."""
    from clustersim.hardware_specs import SpecError
    header, cells = _dev_row_without(column)
    with pytest.raises(SpecError, match=f"--runs: .*runs.csv {expected}"):
        validate_rows(_table(tmp_path, header, [cells]), catalog)


def test_mxfp8_on_a_device_without_block_scaled_fp8_is_reported_under_its_column(catalog):
    from clustersim.hardware_specs import SpecError
    from clustersim.analysis.validation.published import row_config
    row = dict(next(csv.DictReader(open(RUNS))), precision="fp8", fp8_recipe="mxfp8")
    with pytest.raises(SpecError, match="^fp8_recipe: mxfp8 needs block-scaled FP8 tensor cores; "
                                        "a100-80gb has no mxfp8 rate"):
        row_config(row, catalog)


def test_two_runs_of_one_id_are_refused(catalog, tmp_path):
    from clustersim.hardware_specs import SpecError
    header, cells = _dev_row_without("")
    with pytest.raises(SpecError, match=f"runs.csv: line 3: id '{cells[0]}' is already the run "
                                        "of line 2"):
        validate_rows(_table(tmp_path, header, [cells, cells]), catalog)


@pytest.mark.parametrize("table", sorted(p.name for p in (REPO / "analysis/data").glob(
    "published_runs_*.csv") if p.name != "published_runs_cnn.csv"))
def test_every_bundled_table_uses_known_columns_only(table):
    from clustersim.analysis.validation.published import COLUMNS
    header = next(csv.reader((REPO / "analysis/data" / table).open()))
    assert [c for c in header if c not in COLUMNS] == []


def test_a_node_column_runs_the_row_on_that_node(catalog):
    """BLOOM-176B trained on Jean Zay's A100 nodes with 4 Omni-Path links each, not on DGX A100s
    with 8 HDR NICs; the ``node`` column says so and the row runs there."""
    from clustersim.analysis.validation.published import row_config
    rows = csv.DictReader(open(REPO / "analysis/data/published_runs_megatron_family.csv"))
    bloom = next(r for r in rows if r["id"] == "bloom176b_jeanzay")
    node = row_config(bloom, catalog).cluster.node
    assert (node.name, node.nic_count, node.nic_bandwidth * 8) == ("jean-zay-a100", 4, 100e9)
    assert row_config(dict(bloom, node=""), catalog).cluster.node.name == "dgx-a100"


@pytest.mark.slow
def test_bloom_176b_within_twelve_percent_of_its_logged_iteration(catalog):
    """tr11-176B-ml's log: 104.70 s per iteration (GBS 2048, TP 4, PP 12, DP 8, MBS 2) with
    unfused attention on Omni-Path nodes."""
    from clustersim.analysis.validation.published import row_config
    from clustersim.analysis.step import run_step
    rows = csv.DictReader(open(REPO / "analysis/data/published_runs_megatron_family.csv"))
    bloom = next(r for r in rows if r["id"] == "bloom176b_jeanzay")
    predicted = run_step(row_config(bloom, catalog)).result.step_time_s
    assert abs(predicted / 104.70 - 1) <= 0.12


def test_h200_in_step_throughput_of_a_2026_stack(catalog):
    """The in-training GEMM factor (fitted on MosaicML's 2023 H100 runs) against a measurement
    made inside a training step with a 2026 software stack (torch 2.13, CUDA 13.0, DeepSpeed
    0.19.2, FlashAttention-3), never used to set it: stas00/ml-engineering
    insights/when-to-upgrade-gpus, "Step decomposition @ 8k": Llama-3.1-8B, 8x H200, ZeRO-2,
    micro-batch 1, seq 8192, no recompute, 461 TFLOPS per GPU in total. Its FLOP count
    (bench_decompose.py flops_split: 6 x (layer linears x 32 + vocab x hidden) x tokens, plus
    6 s^2 x head_dim x heads x layers) is 421.6 TFLOP per GPU, so one step takes 0.9146 s."""
    from clustersim.analysis.validation.published import row_config
    from clustersim.analysis.step import run_step
    row = {"id": "mle_h200_llama31_8b", "source": "stas00/ml-engineering (2026)",
           "model_name": "Llama-3.1-8B", "layers": "32", "hidden": "4096", "ffn_hidden": "14336",
           "heads": "32", "kv_heads": "8", "vocab": "128256", "mlp": "swiglu", "seq_len": "8192",
           "global_batch": "8", "micro_batch": "1", "gpu": "h200", "num_gpus": "8",
           "gpus_per_node": "8", "tp": "1", "pp": "1", "dp": "8", "zero": "2",
           "recompute": "none", "precision": "bf16", "attention": "flash3",
           "measured_step_time_s": "0.9146"}
    hidden, ffn, kv, layers, vocab, tokens = 4096, 14336, 1024, 32, 128256, 8192
    dense = 6 * ((3 * hidden * ffn + hidden * (2 * hidden + 2 * kv)) * layers + vocab * hidden)
    attention = 6 * tokens ** 2 * 128 * 32 * layers
    assert dense * tokens + attention == pytest.approx(421.6e12, rel=1e-3)
    assert (dense * tokens + attention) / 461e12 == pytest.approx(0.9146, rel=1e-3)
    predicted = run_step(row_config(row, catalog)).result.step_time_s
    assert abs(predicted / 0.9146 - 1) <= 0.05


@pytest.mark.slow
def test_megatron_lm_h100_weak_scaling_within_twelve_percent(catalog, tmp_path):
    """The Megatron-LM README's H100 weak-scaling table (1.7B-462B on 48-6144 GPUs); its
    pipelined rows run interleaved (the README's PP communication overlap needs the interleaved
    schedule in Megatron-LM's validate_args)."""
    path = REPO / "analysis/data/published_runs_megatron_family.csv"
    rows = [r for r in csv.DictReader(open(path)) if r["id"].startswith("megatronlm_h100_weak")]
    assert len(rows) == 9
    assert all(int(r["virtual_stages"] or 1) > 1 for r in rows if int(r["pp"]) > 1)
    subset = tmp_path / "weak.csv"
    with open(subset, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = summarize(validate_rows(subset, catalog))
    assert summary.compared == 9 and summary.mape <= 0.12
