"""Communication inside a node from calibrated alpha-beta fits instead of NCCL's tables.

A node whose spec carries ``measured_comm`` (written by ``clustersim calibrate fit``, e.g. gloo
between CPU processes) times each collective of a group that stays inside one node as
``steps x latency + traffic / bandwidth`` with the ring's steps and per-rank traffic
(``hardware_specs/measured_comm.py``). Groups that span nodes, and operations the node has no
fit for, keep the analytic model.
"""

from __future__ import annotations

from clustersim.hardware_specs.measured_comm import AlphaBeta, CommOp
from clustersim.simulator.cost.collectives import Algorithm, Plan, Protocol, bus_factor
from clustersim.simulator.cost.network import Instances, NetworkModel
from clustersim.workloads.trace import CollectiveKind, Dispatcher, TokenRouting

_OP_OF_KIND = {
    CollectiveKind.ALL_REDUCE: CommOp.ALL_REDUCE,
    CollectiveKind.ALL_GATHER: CommOp.ALL_GATHER,
    CollectiveKind.REDUCE_SCATTER: CommOp.REDUCE_SCATTER,
    CollectiveKind.ALL_TO_ALL: CommOp.ALL_TO_ALL,
    CollectiveKind.BROADCAST: CommOp.BROADCAST,
    CollectiveKind.RING_EXCHANGE: CommOp.SEND_RECV,
}


_KIND_OF_OP = {op: kind for kind, op in _OP_OF_KIND.items()}


def ring_steps_and_traffic(op: CommOp, n: int) -> tuple[int, float]:
    """(steps, per-rank bytes per byte of buffer) of the ring algorithm on ``n`` ranks: the bus
    factor (``collectives.bus_factor``), in 2(n-1) steps for all-reduce, n-1 for the other
    collectives, one for a send/recv."""
    steps = {CommOp.ALL_REDUCE: 2 * (n - 1), CommOp.SEND_RECV: 1}.get(op, n - 1)
    return steps, bus_factor(_KIND_OF_OP[op], n)


def measured_time(fit: AlphaBeta, op: CommOp, n: int, nbytes: float) -> float:
    return sum(_terms(fit, op, n, nbytes))


def _terms(fit: AlphaBeta, op: CommOp, n: int, nbytes: float) -> tuple[float, float]:
    """(latency, transfer) seconds."""
    steps, traffic = ring_steps_and_traffic(op, n)
    return steps * fit.latency_s, traffic * nbytes / fit.bandwidth


class MeasuredNetwork(NetworkModel):
    """``NetworkModel`` with the node's measured fits for groups inside one node."""

    def _inside_one_node(self, devices) -> bool:
        return len({self.topology.location(d).node for d in devices}) == 1

    def plan(self, kind: CollectiveKind, nbytes: float, instances: Instances,
             routing: TokenRouting | None = None) -> Plan:
        op = _OP_OF_KIND.get(kind)
        fit = self.cluster.node.measured_comm.get(op) if op is not None else None
        deepep = routing is not None and routing.dispatcher is not Dispatcher.ALLTOALL
        if fit is None or deepep or not self._inside_one_node(instances[0]):
            return super().plan(kind, nbytes, instances, routing)
        return self._plan(fit, op, len(instances[0]), nbytes)

    def p2p_plan(self, nbytes: float, pairs: list[tuple[int, int]]) -> Plan:
        fit = self.cluster.node.measured_comm.get(CommOp.SEND_RECV)
        if fit is None or not all(self._inside_one_node(p) for p in pairs):
            return super().p2p_plan(nbytes, pairs)
        return self._plan(fit, CommOp.SEND_RECV, 2, nbytes)

    def _plan(self, fit: AlphaBeta, op: CommOp, n: int, nbytes: float) -> Plan:
        """A plan on the node's own links only (no network load), as long as it takes inside a
        training step; interference and degraded links stretch its transfer part."""
        factor = self.cluster.node.comm_in_training
        latency, transfer = _terms(fit, op, n, nbytes)
        return Plan(Algorithm.DIRECT, Protocol.SIMPLE, latency * factor, transfer * factor, ())
