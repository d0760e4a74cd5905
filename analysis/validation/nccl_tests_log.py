"""Read what nccl-tests printed, so ``clustersim collective --against LOG`` can hold the model
against it.

nccl-tests (NVIDIA/nccl-tests, ``src/common.cu``) prints a header (``# nThread T nGpus G ...``,
one ``#  Rank  r ...`` line per rank under ``# Using devices``) and one line per size:
``size count type [redop] [root] time algbw busbw #wrong time algbw busbw #wrong``, the first
triple out-of-place, the second in-place (older versions print no redop or no root column). ``mpirun
--tag-output`` prefixes every line with ``[1,0]<stdout>:``. Only the out-of-place triple is read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clustersim.hardware_specs import SpecError
from clustersim.hardware_specs.textfile import read_text

_TAG = re.compile(r"^\[\d+,\d+\]<std(out|err)>:")
_HEADER = re.compile(r"nThread\s+\d+\s+nGpus\s+(\d+)")
_RANK = re.compile(r"^#?\s*Rank\s+\d+\s")
_TEST = re.compile(r"Collective test starting:\s*(\w+?)_perf")


@dataclass(frozen=True)
class MeasuredRow:
    bytes: int
    time_s: float
    algbw_gbps: float
    busbw_gbps: float


@dataclass(frozen=True)
class NcclTestsLog:
    rows: tuple[MeasuredRow, ...]
    ranks: int | None
    """``Rank`` lines under ``# Using devices``; None when the log leaves them out."""
    gpus_per_thread: int
    """nccl-tests ``-g``: GPUs one thread drives (1 when the header is missing)."""
    op: str | None
    """From ``# Collective test starting: all_reduce_perf`` (newer nccl-tests), else None."""


def _digits(token: str) -> bool:
    """ASCII digits only: str.isdigit() also accepts '²', which int() refuses."""
    return token.isascii() and token.isdigit()


def _row(tokens: list[str]) -> MeasuredRow | None:
    if len(tokens) < 7 or not _digits(tokens[0]) or not _digits(tokens[1]):
        return None
    rest = tokens[4:] if tokens[3].isalpha() else tokens[3:]   # redop: absent before 2.x
    # root, then (time algbw busbw #wrong) twice: an odd count; a trimmed line keeps root -1
    if len(rest) % 2 == 1 or rest[0] == "-1":
        rest = rest[1:]
    try:
        time_us, algbw, busbw = (float(x) for x in rest[:3])
    except ValueError:
        return None
    return MeasuredRow(int(tokens[0]), time_us * 1e-6, algbw, busbw)


def parse_log(text: str, where: str = "--against", path: str = "") -> NcclTestsLog:
    """``path``: the file the text came from, named in the error."""
    source = f"{path}: " if path else ""
    rows, ranks, gpus, op = [], 0, 1, None
    for raw in text.splitlines():
        line = _TAG.sub("", raw).strip()
        if (m := _HEADER.search(line)) is not None:
            gpus = int(m.group(1))   # -t T threads of -g G GPUs: a thread still drives G
        elif (m := _TEST.search(line)) is not None:
            op = m.group(1)
        elif _RANK.match(line):
            ranks += 1
        elif not line.startswith("#") and (row := _row(line.split())) is not None:
            rows.append(row)
    if not rows:
        raise SpecError(where, f"{source}expected nccl-tests output with at least one result "
                               "line (size count type redop ... time algbw busbw), found none")
    return NcclTestsLog(tuple(rows), ranks or None, gpus, op)


def read_log(path: str) -> NcclTestsLog:
    return parse_log(read_text(path, "--against", errors="replace"), path=str(path))
