"""PyTorch profiler (Kineto) JSON -> one rank's recording.

What the file holds (``torch.profiler`` ``export_chrome_trace``): complete events (``ph: X``,
``ts``/``dur`` in microseconds) of CPU operators (``cpu_op``, with ``Input Dims``/``Input type``
when recorded with ``record_shapes``), user annotations, and on GPUs the kernels, memcpys and
memsets of each stream (``kernel``, ``gpu_memcpy``, ``gpu_memset``, with ``stream`` and the
``correlation`` id of the ``cuda_runtime`` launch); ``distributedInfo`` gives the rank, the world
size and every process group's ranks.

How it becomes a recording:
- CPU-only trace: the compute stream is the host thread that spends the most time in operators;
  each top-level operator of it is one measured op, its kernels the work of the operators inside.
- GPU trace: every compute kernel, of whatever stream, is one measured op on the compute stream
  in start order (concurrent compute streams serialise), its work that of the operator that
  launched it (``External id``); memcpys host<->device are copies.
- Collectives: ``record_param_comms`` (``Collective name``, ``In msg nelems``, ``Out msg
  nelems``, ``dtype``, ``Process Group Ranks``, as NCCL's process group records them) or, where
  the backend records none (gloo), the ``c10d::*`` operator with its input shapes and the
  process group of ``distributedInfo`` (which must then be unambiguous). A collective completes
  when its NCCL kernel ends (GPU) or when gloo's worker thread ends it (``gloo:*`` events, in
  order); ``send``/``recv`` likewise, with the peer from the operator's arguments.
"""

from __future__ import annotations

import ast
import bisect
from collections import defaultdict
from collections.abc import Mapping

from clustersim.hardware_specs import SpecError
from clustersim.workloads.trace import CollectiveKind, CopyKind, Phase
from clustersim.workloads.trace_import.op_work import (
    SHAPE_ONLY, element_bytes, is_work, kernel_of, tensor_bytes,
)
from clustersim.workloads.trace_import.recording import (
    CollectiveItem, ComputeItem, CopyItem, Item, PointToPointItem, RankRecording,
)

US = 1e-6

COLLECTIVE_OF = {
    "allreduce": CollectiveKind.ALL_REDUCE, "all_reduce": CollectiveKind.ALL_REDUCE,
    "allgather": CollectiveKind.ALL_GATHER, "all_gather": CollectiveKind.ALL_GATHER,
    "_allgather_base": CollectiveKind.ALL_GATHER, "allgather_into_tensor_coalesced":
    CollectiveKind.ALL_GATHER, "all_gather_into_tensor": CollectiveKind.ALL_GATHER,
    "reduce_scatter": CollectiveKind.REDUCE_SCATTER, "_reduce_scatter_base":
    CollectiveKind.REDUCE_SCATTER, "reduce_scatter_tensor": CollectiveKind.REDUCE_SCATTER,
    "reduce_scatter_tensor_coalesced": CollectiveKind.REDUCE_SCATTER,
    "alltoall": CollectiveKind.ALL_TO_ALL, "alltoall_base": CollectiveKind.ALL_TO_ALL,
    "all_to_all": CollectiveKind.ALL_TO_ALL, "all_to_allv": CollectiveKind.ALL_TO_ALL,
    "broadcast": CollectiveKind.BROADCAST,
}
"""Collective names as c10d and NCCL's ``record_param_comms`` spell them."""
P2P = {"send": True, "recv": False, "recv_": False}
IGNORED_COMMS = ("barrier", "monitored_barrier", "wait", "init", "coalesced")
"""c10d operators that move no payload."""
BACKWARD_MARKERS = ("autograd::engine::evaluate_function", "Backward")


def _comm_name(name: str) -> str:
    """``c10d::allreduce_`` -> ``allreduce``."""
    return name.split("::", 1)[1].rstrip("_") if name.startswith("c10d::") else name


class _Events:
    """Complete events of one file, by thread, with their nesting."""

    def __init__(self, data: Mapping, file: str):
        self.file = file
        events = data.get("traceEvents")
        if not isinstance(events, list):
            raise SpecError(file, "not a PyTorch profiler trace: no traceEvents list")
        self.complete = []
        for i, e in enumerate(events):
            if not isinstance(e, Mapping) or e.get("ph") != "X":
                continue
            try:
                ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
            except (KeyError, TypeError, ValueError):
                raise SpecError(f"{file}: traceEvents[{i}]", "a complete event without a "
                                "numeric ts/dur (truncated or edited file?)") from None
            if dur < 0:
                raise SpecError(f"{file}: traceEvents[{i}] ({e.get('name')!r})",
                                f"negative duration {dur}")
            self.complete.append(e)
        self.complete.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0.0))))

    def of(self, cat: str | tuple[str, ...]) -> list[Mapping]:
        cats = (cat,) if isinstance(cat, str) else cat
        return [e for e in self.complete if e.get("cat") in cats]


def _args(e: Mapping) -> Mapping:
    a = e.get("args")
    return a if isinstance(a, Mapping) else {}


def _start(e: Mapping) -> float:
    return float(e["ts"])


def _end(e: Mapping) -> float:
    return float(e["ts"]) + float(e.get("dur", 0.0))


def _trees(ops: list[Mapping]) -> list[tuple[Mapping, list[Mapping]]]:
    """Top-level operators of one thread with their descendants (time containment)."""
    out: list[tuple[Mapping, list[Mapping]]] = []
    for e in ops:
        if out and _start(e) < _end(out[-1][0]) - 1e-3:
            out[-1][1].append(e)
        else:
            out.append((e, []))
    return out


def _work(top: Mapping, inner: list[Mapping]):
    """Kernels of a top-level operator: its outermost GEMM/attention operators, and the
    leaves (operators with nothing inside) outside those."""
    ops = [top] + inner
    kernels, covered_until = [], -1.0
    for i, e in enumerate(ops):
        if _start(e) < covered_until:
            continue
        inside = [o for o in ops[i + 1:] if _start(o) < _end(e) - 1e-3]
        has_child = any(o["name"] not in SHAPE_ONLY for o in inside)
        if is_work(e["name"]) or not has_child:
            a = _args(e)
            k = kernel_of(e["name"], a.get("Input Dims", []), a.get("Input type", []),
                          a.get("Concrete Inputs", []))
            if k is not None:
                kernels.append(k)
            if is_work(e["name"]):
                covered_until = _end(e) - 1e-3
    return tuple(kernels)


def _phase(top: Mapping, inner: list[Mapping], optimizer_spans: list[tuple[float, float]]) -> Phase:
    if any(a <= _start(top) < b for a, b in optimizer_spans):
        return Phase.OPTIMIZER
    if any(m in top["name"] for m in BACKWARD_MARKERS):
        return Phase.BACKWARD
    return Phase.FORWARD


class KinetoRank:
    """Reads one rank's file; :meth:`recording` gives its items."""

    def __init__(self, data: Mapping, file: str):
        self.data, self.file = data, file
        self.events = _Events(data, file)
        info = data.get("distributedInfo") if isinstance(data.get("distributedInfo"), Mapping) \
            else {}
        self.rank = int(info.get("rank", 0))
        self.world = int(info.get("world_size", 1))
        self.groups: dict[str, tuple[int, ...]] = {}
        for pg in info.get("pg_config", []) or []:
            ranks = pg.get("ranks", [])
            if isinstance(ranks, str):
                ranks = ast.literal_eval(ranks) if ranks.strip() else []
            self.groups[str(pg.get("pg_name", len(self.groups)))] = tuple(int(r) for r in ranks)
        props = data.get("deviceProperties") or []
        device = props[0].get("name") if props and isinstance(props[0], Mapping) else "cpu"
        self.facts = {"device": str(data.get("device", device)),
                      "framework": str(data.get("framework", data.get("pytorch_version",
                                                                       "unknown"))),
                      "host": str(data.get("host_name", data.get("host", "unknown"))),
                      "recorded": str(data.get("recorded_at", "unknown")),
                      "backend": str(info.get("backend", "none"))}

    # --- process groups --------------------------------------------------------------
    def _group(self, e: Mapping) -> tuple[str, tuple[int, ...]]:
        a = _args(e)
        ranks = a.get("Process Group Ranks")
        name = str(a.get("Process Group Name", ""))
        if ranks is not None:
            if isinstance(ranks, str):
                ranks = ast.literal_eval(ranks) if ranks.strip() else []
            ranks = tuple(int(r) for r in ranks)
            if ranks:
                return name or ",".join(map(str, ranks)), ranks
        if name in self.groups and self.groups[name]:
            return name, self.groups[name]
        distinct = {r for r in self.groups.values() if r}
        if len(distinct) == 1:
            ranks = distinct.pop()
            return ",".join(map(str, ranks)), ranks
        if not distinct and self.world >= 1:
            ranks = tuple(range(self.world))
            return "world", ranks
        raise SpecError(f"{self.file}: {e['name']} at ts {e['ts']} us",
                        f"the trace does not say which of its {len(distinct)} process groups "
                        "this collective ran on (record it with a backend that writes "
                        "record_param_comms, e.g. NCCL, or from a job with one group)")

    # --- communication ---------------------------------------------------------------
    def _comm_item(self, e: Mapping, end_s: float | None) -> Item | None:
        a = _args(e)
        name = str(a.get("Collective name", "")) if e["name"] == "record_param_comms" \
            else _comm_name(e["name"])
        where = f"{self.file}: {e['name']} ({name}) at ts {e['ts']} us"
        if name in P2P:
            return self._p2p_item(e, name, end_s, where)
        kind = COLLECTIVE_OF.get(name)
        if kind is None:
            if any(name.startswith(i) for i in IGNORED_COMMS):
                return None
            raise SpecError(where, f"unknown collective {name!r} (known: "
                            f"{', '.join(sorted(COLLECTIVE_OF))}, send, recv)")
        group_name, ranks = self._group(e)
        if "In msg nelems" in a:
            elem = element_bytes(str(a.get("dtype", "float")))
            n_in, n_out = float(a["In msg nelems"]), float(a.get("Out msg nelems", 0))
            # nccl-tests buffers: all-gather the output, the others their input.
            nbytes = (n_out if kind is CollectiveKind.ALL_GATHER else n_in) * elem
            if kind is CollectiveKind.ALL_GATHER and n_out == 0:
                nbytes = n_in * elem * len(ranks)
        else:
            nbytes = tensor_bytes(a.get("Input Dims", []), a.get("Input type", []))
            if kind is CollectiveKind.ALL_GATHER and e["name"] != "c10d::_allgather_base_":
                nbytes *= len(ranks)
        if nbytes <= 0:
            raise SpecError(where, "no message size: record with record_shapes=True")
        return CollectiveItem(name=f"{name}", kind=kind, bytes=nbytes, ranks=ranks,
                              group_name=group_name, start_s=_start(e) * US,
                              end_s=end_s)

    def _p2p_item(self, e: Mapping, name: str, end_s, where: str) -> PointToPointItem:
        a = _args(e)
        peer = a.get("Peer rank", a.get("dst_rank", a.get("src_rank")))
        concrete = a.get("Concrete Inputs", [])
        if peer is None and len(concrete) > 2 and str(concrete[2]).lstrip("-").isdigit():
            peer = int(concrete[2])
        if peer is None:
            raise SpecError(where, "a send/recv whose peer rank the trace does not record")
        nbytes = (float(a["In msg nelems"]) * element_bytes(str(a.get("dtype", "float")))
                  if "In msg nelems" in a else
                  tensor_bytes(a.get("Input Dims", []), a.get("Input type", [])))
        return PointToPointItem(name=name, send=P2P[name], peer=int(peer), bytes=nbytes,
                                start_s=_start(e) * US, end_s=end_s)

    def _comm_events(self, ops: list[Mapping]) -> list[Mapping]:
        """c10d operators and record_param_comms, one per call (the innermost)."""
        comms = [e for e in ops if e["name"] == "record_param_comms" or e["name"].startswith("c10d::")]
        out = []
        for e in comms:
            inner = [c for c in comms if c is not e and _start(e) <= _start(c) and _end(c) <= _end(e)]
            if not inner:
                out.append(e)
        return out

    # --- the two timelines -----------------------------------------------------------
    def recording(self) -> RankRecording:
        kernels = self.events.of("kernel")
        items = self._gpu_items(kernels) if kernels else self._cpu_items()
        return RankRecording(rank=self.rank, world_size=self.world, items=tuple(items),
                             file=self.file, facts=self.facts)

    def _main_thread(self, ops: list[Mapping]):
        busy: dict = defaultdict(float)
        for top, _ in _trees(ops):
            busy[top["tid"]] += float(top.get("dur", 0.0))
        if not busy:
            raise SpecError(self.file, "no CPU operators recorded (an empty or trimmed trace?)")
        return max(busy, key=lambda t: (busy[t], str(t)))

    def _optimizer_spans(self) -> list[tuple[float, float]]:
        return [(_start(e), _end(e)) for e in self.events.of("user_annotation")
                if e["name"].startswith("Optimizer.step")]

    def _cpu_items(self) -> list[Item]:
        ops = self.events.of("cpu_op")
        tid = self._main_thread(ops)
        mine = [e for e in ops if e["tid"] == tid]
        comms = self._comm_events(mine)
        ends = _gloo_completions(comms, [e for e in self.events.of("user_annotation")
                                         if e["name"].startswith("gloo:")])
        items: list[Item] = []
        spans = self._optimizer_spans()
        comm_ids = {id(c) for c in comms}
        for c in comms:
            item = self._comm_item(c, ends.get(id(c)))
            if item is not None:
                items.append(item)
        for top, inner in _trees(mine):
            if id(top) in comm_ids:
                continue
            body = [e for e in inner if id(e) not in comm_ids]
            items.append(ComputeItem(name=top["name"], start_s=_start(top) * US,
                                     end_s=_end(top) * US, kernels=_work(top, body),
                                     phase=_phase(top, inner, spans)))
        items.sort(key=lambda i: (i.start_s, isinstance(i, ComputeItem)))
        return items

    def _gpu_items(self, kernels: list[Mapping]) -> list[Item]:
        ops = self.events.of(("cpu_op", "user_annotation"))
        launches = {_args(e).get("correlation"): e for e in self.events.of("cuda_runtime")}
        comm_ops = sorted(self._comm_events(ops), key=_start)
        starts = [_start(c) for c in comm_ops]
        launched_by = {_args(e).get("External id"): e for e in self.events.of("cpu_op")
                       if _args(e).get("External id") is not None}
        spans = self._optimizer_spans()
        items: list[Item] = []
        for k in kernels:
            a = _args(k)
            if k["name"].startswith("nccl"):
                launch = launches.get(a.get("correlation"))
                owner = None
                if launch is not None:
                    i = bisect.bisect_right(starts, _start(launch)) - 1
                    while i >= 0 and owner is None:
                        c = comm_ops[i]
                        if _end(c) >= _start(launch) and c.get("tid") == launch.get("tid"):
                            owner = c
                        i -= 1
                if owner is None:
                    raise SpecError(f"{self.file}: kernel {k['name'][:60]!r} at ts {k['ts']} us",
                                    "an NCCL kernel with no record_param_comms or c10d operator "
                                    "around its launch: its size and group are unknown")
                item = self._comm_item(owner, _end(k) * US)
                if item is not None:
                    items.append(_replace_start(item, _start(k) * US))
                continue
            items.append(ComputeItem(name=k["name"], start_s=_start(k) * US, end_s=_end(k) * US,
                                     kernels=_launcher_work(launched_by.get(a.get("External id"))),
                                     phase=Phase.OPTIMIZER if any(
                                         x <= _start(k) < y for x, y in spans) else Phase.FORWARD))
        for m in self.events.of(("gpu_memcpy", "gpu_memset")):
            a = _args(m)
            kind = {"HtoD": CopyKind.HOST_TO_DEVICE, "DtoH": CopyKind.DEVICE_TO_HOST}.get(
                m["name"].replace("Memcpy ", "").split(" ")[0])
            nbytes = float(a.get("bytes", 0.0))
            if kind is not None:
                items.append(CopyItem(name=m["name"], kind=kind, bytes=nbytes,
                                      start_s=_start(m) * US, end_s=_end(m) * US))
            else:
                items.append(ComputeItem(name=m["name"], start_s=_start(m) * US,
                                         end_s=_end(m) * US))
        items.sort(key=lambda i: (i.start_s, isinstance(i, ComputeItem)))
        return items


def _squash(name: str) -> str:
    return name.split(":", 1)[-1].replace("_", "").lower()


def _gloo_completions(comms: list[Mapping], work: list[Mapping]) -> dict[int, float]:
    """When each c10d call's work finished: gloo records an event per operation (``gloo:send``,
    ``gloo:all_reduce``...) from when it is issued to when it completes, on the calling thread
    or a worker thread; each call takes the first unclaimed one of its kind that starts after it
    did. Calls with none (the trace was cut) complete, as far as we know, when they return."""
    claimed: set[int] = set()
    ends = {}
    work = sorted(work, key=_start)
    for c in sorted(comms, key=_start):
        kind = _squash(_comm_name(c["name"]) if c["name"] != "record_param_comms"
                       else str(_args(c).get("Collective name", "")))
        for i, w in enumerate(work):
            if i not in claimed and _start(w) >= _start(c) and _squash(w["name"]) in kind:
                claimed.add(i)
                ends[id(c)] = _end(w) * US
                break
    return ends


def _launcher_work(op: Mapping | None) -> tuple:
    """The work of the operator that launched a kernel, from its recorded shapes."""
    if op is None:
        return ()
    a = _args(op)
    k = kernel_of(op["name"], a.get("Input Dims", []), a.get("Input type", []),
                  a.get("Concrete Inputs", []))
    return () if k is None else (k,)


def _replace_start(item: Item, start_s: float) -> Item:
    from dataclasses import replace
    return replace(item, start_s=start_s)


def read_rank(data: Mapping, file: str) -> RankRecording:
    return KinetoRank(data, file).recording()
