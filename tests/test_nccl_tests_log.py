"""Reading nccl-tests output, and holding the model against it from the command line."""

import json

import pytest

from clustersim.analysis.validation.nccl_tests_log import parse_log
from clustersim.hardware_specs import SpecError

from tests.test_cli import clustersim

# The 8x A100 -g 8 sweep of the dev set, as nccl-tests 2.13 prints it (one thread, eight GPUs).
G8_LOG = """# nThread 1 nGpus 8 minBytes 8388608 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 50 agg iters: 1 validation: 1 graph: 0
#
# Using devices
""" + "".join(f"#  Rank  {r} Group  0 Pid  1 on node device  {r} [0x07] NVIDIA A100-SXM4-80GB\n"
              for r in range(8)) + """#
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
     1048576        262144     float     sum      -1    101.9   10.29   18.00      0    101.5   10.33   18.08      0
  1073741824     268435456     float     sum      -1   8203.9  130.88  229.04      0   8201.1  130.92  229.11      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 123.5
"""


def test_reads_every_layout_nccl_tests_has_printed():
    log = parse_log("""[1,0]<stdout>:# nThread 1 nGpus 1 minBytes 8 maxBytes 64 step: 2(factor)
[1,0]<stdout>:#  Rank  0 Group  0 Pid 1 on a device  0 [0x0f] NVIDIA H100
[1,0]<stdout>:#  Rank  1 Group  0 Pid 2 on a device  1 [0x15] NVIDIA H100
[1,0]<stdout>:           8             2     float     sum      -1    12.90    0.00    0.00      0    12.87    0.00    0.00      0
     1048576        262144     float     sum    127.9    8.20   15.38  5e-07    126.9    8.26   15.49  5e-07
       32768          4096   float    13.39    1.22    1.22  0e+00    11.85    1.38    1.38  0e+00
     8388608       2097152     float    none      -1    21.17   24.77   43.35    N/A    20.96   25.01   43.77    N/A
  4294967296    1073741824     float     sum      -1    34176  125.67  235.63      0
""")
    assert (log.ranks, log.gpus_per_thread, log.op) == (2, 1, None)
    assert [r.bytes for r in log.rows] == [8, 1048576, 32768, 8388608, 4294967296]
    assert [r.time_s * 1e6 for r in log.rows] == pytest.approx([12.90, 127.9, 13.39, 21.17, 34176])
    assert [r.busbw_gbps for r in log.rows] == [0.0, 15.38, 1.22, 43.35, 235.63]


def test_a_log_without_results_is_an_error():
    with pytest.raises(SpecError, match="--against: expected nccl-tests output"):
        parse_log("# nThread 1 nGpus 8\n#  Rank  0 Group 0\nsomething else\n")


@pytest.mark.slow
def test_against_takes_ranks_and_gpus_per_thread_from_the_log(tmp_path):
    path = tmp_path / "a100.log"
    path.write_text(G8_LOG)
    out = tmp_path / "rows.json"
    run = clustersim("collective", "--gpu", "a100-80gb", "--against", str(path), "--json", str(out))
    assert run.returncode == 0, run.stderr
    assert "all_reduce on 8 x a100-80gb" in run.stdout and "8 GPUs per thread" in run.stdout
    rows = json.loads(out.read_text())
    assert [r["bytes"] for r in rows] == [1048576, 1073741824]
    assert rows[0]["measured_time_s"] == pytest.approx(101.9e-6)
    # the -g 8 host loop sets the 1 MiB row, as in the dev-set test; 1 GiB is the NVLink ring
    for r in rows:
        assert r["measured_time_s"] / r["time_s"] - 1 == pytest.approx(0, abs=0.05)
    assert "mean |error|" in run.stdout and "avg bus bandwidth" in run.stdout


@pytest.mark.slow
def test_against_the_bundled_h100_log_prints_each_sizes_error():
    run = clustersim("collective", "--gpu", "h100-sxm", "--gpus", "8",
                     "--against", "examples/nccl_tests_h100_p5.log")
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("nvls/Simple") == 13   # 4 MiB to 16 GiB; LL rings below
    assert "over 32 sizes" in run.stdout


@pytest.mark.slow
def test_against_disagreeing_with_the_log_names_the_flag(tmp_path):
    path = tmp_path / "a100.log"
    path.write_text(G8_LOG)
    run = clustersim("collective", "--gpu", "a100-80gb", "--gpus", "16", "--against", str(path))
    assert run.returncode == 2 and "error: --gpus: 16 disagrees with the log's 8" in run.stderr
    missing = clustersim("collective", "--gpu", "a100-80gb", "--against", str(tmp_path / "none"))
    assert missing.returncode == 2 and "error: --against: cannot read" in missing.stderr
