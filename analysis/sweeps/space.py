"""The strategy space of a sweep: which strategies exist for a model on a cluster, which of them
are worth simulating, and why the others are not.

Every combination of the axes below is enumerated; ``workloads.strategy.check_strategy`` (the one
home of the divisibility rules) rejects the impossible ones, ``workloads.memory`` the ones that do
not fit in HBM, and the dominance rule the ones that cannot be faster than another that fits.

Default axes (change any of them in the config's ``sweep:`` section):

- ``tp``, ``pp``: every divisor of the GPU count (``dp`` takes the rest), so tensor
  parallelism across nodes is explored too;
- ``cp`` and ``micro_batch``: the config's own values (context parallelism is for long
  sequences and its ring steps make a simulation many times longer; the micro-batch is a batch
  setting): list values to explore them, e.g. ``sweep: {cp: [1, 2, 4], micro_batch: [1, 2]}``;
- ``cp_algorithm``: with cp > 1, ring, all-gather, Ulysses, and hierarchical with each
  all-to-all domain size ``cp_a2a`` that divides cp (2 to cp/2); Ulysses and hierarchical
  only where the heads divide (``check_strategy`` says why not);
- ``schedule``: ``1f1b``, and ``interleaved`` with each of ``virtual_stages`` (default 2);
- ``recompute``: none, selective, full; ``zero``: 0-3; ``offload``: none, optimizer, params;
- ``sequence_parallel``: on whenever tp > 1 (it splits norms and dropout over TP for the same
  communication volume, Korthikanti et al. 2022 sec. 4.2.2).

Dominance (``prune_dominated``, on by default): for one parallel layout (degrees, micro-batch,
schedule), a memory saver that adds work is only worth simulating when no lighter setting fits.
The order is the work each adds: recompute none < selective < full (recomputed FLOPs), offload
none < optimizer < params (host transfers), ZeRO-1 < ZeRO-2 (the same collectives; stage 2 only
frees gradients sooner). ZeRO 0, 1 and 3 communicate differently and are all simulated, except
where ZeRO has no group to shard over (dp x cp = 1 and one expert-data rank): there every stage
builds the same step, so only the lowest is simulated. A dominated strategy is listed with the one that dominates it; ``tests/test_sweep.py`` checks on
exhaustive sweeps that none is ever faster than its dominator.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

from clustersim.hardware_specs import SpecError
from clustersim.hardware_specs.fields import Fields, parse_enum
from clustersim.workloads import Job
from clustersim.workloads.memory import GIB, StageMemory
from clustersim.workloads.strategy import CpAlgorithm, Offload, Recompute, Schedule, Strategy


class Status(enum.Enum):
    """What the sweep does with a candidate strategy."""

    SIMULATE = "simulate"
    INVALID = "invalid"
    """Breaks a divisibility or support rule (the reason is ``check_strategy``'s message)."""
    DOES_NOT_FIT = "does_not_fit"
    DOMINATED = "dominated"


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepSpace:
    """The values each axis takes; ``()`` means every divisor of the GPU count for ``tp`` and
    ``pp``, and the config's own value for ``cp`` and ``micro_batch``."""

    tp: tuple[int, ...] = ()
    pp: tuple[int, ...] = ()
    cp: tuple[int, ...] = ()
    micro_batch: tuple[int, ...] = ()
    cp_algorithm: tuple[CpAlgorithm, ...] = tuple(CpAlgorithm)
    """Context-parallel variants tried when cp > 1 (cp = 1 has none)."""
    schedule: tuple[Schedule, ...] = (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED)
    virtual_stages: tuple[int, ...] = (2,)
    """Model chunks per stage tried with the interleaved schedule."""
    recompute: tuple[Recompute, ...] = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
    """Per-op recompute (``op``, torchtitan's) is tried only when a space names it."""
    zero: tuple[int, ...] = (0, 1, 2, 3)
    offload: tuple[Offload, ...] = tuple(Offload)
    sequence_parallel: tuple[bool, ...] = (True,)
    """Values tried when tp > 1 (tp = 1 always runs without)."""
    prune_dominated: bool = True

    def to_dict(self) -> dict:
        def plain(values):
            return [v.value if isinstance(v, enum.Enum) else v for v in values]
        return {"tp": list(self.tp), "pp": list(self.pp), "cp": list(self.cp),
                "micro_batch": list(self.micro_batch),
                "cp_algorithm": plain(self.cp_algorithm), "schedule": plain(self.schedule),
                "virtual_stages": list(self.virtual_stages), "recompute": plain(self.recompute),
                "zero": list(self.zero), "offload": plain(self.offload),
                "sequence_parallel": list(self.sequence_parallel),
                "prune_dominated": self.prune_dominated}


def space_from_mapping(data: Mapping | None, path: str = "sweep") -> SweepSpace:
    """The ``sweep:`` config section; omitted axes keep their defaults."""
    f = Fields(data or {}, path).only(SweepSpace.__dataclass_fields__)
    default = SweepSpace()

    def integers(key: str) -> tuple[int, ...]:
        if not f.has(key):
            f.raw(key, None)
            return getattr(default, key)
        values = tuple(f.integers(key, minimum=0 if key == "zero" else 1,
                                  maximum=3 if key == "zero" else None))
        if not values and key not in ("tp", "pp", "cp", "micro_batch"):
            raise SpecError(f.at(key), "expected at least one value")
        return values

    def choices(key: str, enum_type: type[enum.Enum]) -> tuple:
        if not f.has(key):
            f.raw(key, None)
            return getattr(default, key)
        values = tuple(parse_enum(enum_type, v, f"{f.at(key)}[{i}]")
                       for i, v in enumerate(f.items(key)))
        if not values:
            raise SpecError(f.at(key), "expected at least one value")
        return values

    sp = default.sequence_parallel
    if f.has("sequence_parallel"):
        sp = tuple(Fields({"v": v}, f"{f.at('sequence_parallel')}[{i}]").boolean("v")
                   for i, v in enumerate(f.items("sequence_parallel")))
        if not sp:
            raise SpecError(f.at("sequence_parallel"), "expected at least one value")
    space = SweepSpace(
        tp=integers("tp"), pp=integers("pp"), cp=integers("cp"),
        micro_batch=integers("micro_batch"), cp_algorithm=choices("cp_algorithm", CpAlgorithm),
        schedule=choices("schedule", Schedule),
        virtual_stages=integers("virtual_stages"), recompute=choices("recompute", Recompute),
        zero=integers("zero"), offload=choices("offload", Offload), sequence_parallel=sp,
        prune_dominated=f.boolean("prune_dominated", True))
    f.done()
    return space


@dataclass(frozen=True, slots=True)
class Candidate:
    """One strategy of the space and what the sweep does with it."""

    index: int
    """Position in the enumeration (a stable order for ties and for results)."""
    job: Job
    status: Status
    reason: str = ""
    memory: tuple[StageMemory, ...] = ()

    @property
    def key(self) -> str:
        return strategy_key(self.job)

    @property
    def peak_memory_bytes(self) -> float:
        return max((s.memory.required for s in self.memory), default=0.0)


def strategy_key(job: Job) -> str:
    """A short unique name, e.g. ``tp8-pp2-dp4-cp1-mb1-1f1b-sp-selective-z1-none``."""
    s = job.strategy
    schedule = s.schedule.value + (f"x{s.virtual_stages}" if s.virtual_stages > 1 else "")
    return (f"tp{s.tp}-pp{s.pp}-dp{s.dp}-cp{s.cp}{context_suffix(s)}-mb{job.training.micro_batch}"
            f"-{schedule}"
            f"-{'sp' if s.sequence_parallel else 'nosp'}-{s.recompute.value}"
            f"{f'{s.recompute_layers}' if s.recompute_layers else ''}-z{s.zero}-{s.offload.value}")


def context_suffix(s: Strategy) -> str:
    """The context-parallel variant in a key: nothing for the ring, e.g. ``ulysses`` or
    ``hierarchical2`` (its all-to-all domain size) otherwise."""
    if s.cp_algorithm is CpAlgorithm.RING:
        return ""
    return s.cp_algorithm.value + (str(s.cp_a2a) if s.cp_a2a else "")


def context_variants(cp: int, space: SweepSpace) -> list[tuple[CpAlgorithm, int]]:
    """(algorithm, all-to-all domain size) pairs tried for ``cp``."""
    if cp == 1:
        return [(CpAlgorithm.RING, 0)]
    out = []
    for algorithm in space.cp_algorithm:
        if algorithm is CpAlgorithm.HIERARCHICAL:
            out += [(algorithm, d) for d in divisors(cp) if 2 <= d <= cp // 2]
        else:
            out.append((algorithm, 0))
    return out


def divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def _schedules(space: SweepSpace) -> list[tuple[Schedule, int]]:
    out = []
    for schedule in space.schedule:
        if schedule is Schedule.INTERLEAVED:
            out += [(schedule, v) for v in space.virtual_stages if v > 1]
        else:
            out.append((schedule, 1))
    return out


def overlaps(base: Strategy, sequence_parallel: bool, zero: int) -> dict[str, bool]:
    """The config's Megatron-Core overlaps, where a candidate can have them."""
    return {"tp_comm_overlap": base.tp_comm_overlap and sequence_parallel,
            "overlap_param_gather": base.overlap_param_gather and 1 <= zero <= 2}


def block_layers(base: Strategy, recompute: Recompute) -> int:
    """The config's ``recompute_layers`` where full recompute is tried, 0 elsewhere."""
    return base.recompute_layers if recompute is Recompute.FULL else 0


def layouts(base: Job, world: int, space: SweepSpace) -> Iterator[Job]:
    """Every combination of the axes, in a fixed order (not yet checked)."""
    all_divisors = divisors(world)
    tps, pps = space.tp or all_divisors, space.pp or all_divisors
    cps = space.cp or (base.strategy.cp,)
    micro_batches = space.micro_batch or (base.training.micro_batch,)
    for tp, pp, cp in itertools.product(tps, pps, cps):
        if world % (tp * pp * cp):
            continue
        dp = world // (tp * pp * cp)
        for mb, (schedule, v), sp, (algorithm, a2a) in itertools.product(
                micro_batches, _schedules(space),
                sorted(set(space.sequence_parallel) if tp > 1 else {False}),
                context_variants(cp, space)):
            for rc, zero, offload in itertools.product(space.recompute, space.zero, space.offload):
                strategy = replace(base.strategy, tp=tp, pp=pp, dp=dp, cp=cp,
                                   cp_algorithm=algorithm, cp_a2a=a2a,
                                   sequence_parallel=sp, schedule=schedule, virtual_stages=v,
                                   recompute=rc, zero=zero, offload=offload, layers_per_stage=(),
                                   recompute_layers=block_layers(base.strategy, rc),
                                   **overlaps(base.strategy, sp, zero))
                training = replace(base.training, micro_batch=mb)
                yield Job(base.model, training, strategy)


_RECOMPUTE_WORK = {Recompute.NONE: 0, Recompute.SELECTIVE: 1, Recompute.OP: 1.5,
                   Recompute.FULL: 2}
"""Per-op recompute redoes a superset of selective's work (the attention core too when it is
unfused) and a subset of full's."""
_OFFLOAD_WORK = {Offload.NONE: 0, Offload.OPTIMIZER: 1, Offload.PARAMS: 2}


def shards_nothing(s: Strategy) -> bool:
    """ZeRO's sharding groups (dense: ZeRO shards x cp; experts: expert-data ranks) are single
    ranks, so no ZeRO stage gathers, scatters or frees anything."""
    return s.zero_shards * s.cp == 1 and s.expert_dp == 1


def no_more_work(a: Strategy, b: Strategy) -> bool:
    """``a`` adds no work that ``b`` does not (same layout assumed): see the module docstring."""
    zero_ok = a.zero == b.zero or (a.zero, b.zero) == (1, 2) or shards_nothing(a)
    return (zero_ok and _RECOMPUTE_WORK[a.recompute] <= _RECOMPUTE_WORK[b.recompute]
            and _OFFLOAD_WORK[a.offload] <= _OFFLOAD_WORK[b.offload])


def _layout_key(job: Job) -> tuple:
    s = job.strategy
    return (s.tp, s.pp, s.dp, s.cp, s.cp_algorithm, s.cp_a2a, job.training.micro_batch,
            s.schedule, s.virtual_stages, s.sequence_parallel)


def enumerate_space(base: Job, world: int, capacity_bytes: float,
                    space: SweepSpace = SweepSpace()) -> list[Candidate]:
    """Every strategy of ``space`` with its status; only ``SIMULATE`` ones need the engine."""
    out: list[Candidate] = []
    fitting: dict[tuple, list[int]] = {}
    for job in layouts(base, world, space):
        index = len(out)
        try:
            job.checked(world)
        except SpecError as err:
            out.append(Candidate(index, job, Status.INVALID, str(err)))
            continue
        memory = job.memory()
        peak = max(s.memory.required for s in memory)
        if peak > capacity_bytes:
            out.append(Candidate(index, job, Status.DOES_NOT_FIT,
                                 f"needs {peak / GIB:.1f} GiB of {capacity_bytes / GIB:.0f} GiB",
                                 memory))
            continue
        out.append(Candidate(index, job, Status.SIMULATE, "", memory))
        fitting.setdefault(_layout_key(job), []).append(index)
    if space.prune_dominated:
        for members in fitting.values():
            for i in members:
                a = out[i].job.strategy
                lighter = [j for j in members if no_more_work(out[j].job.strategy, a)
                           and (not no_more_work(a, out[j].job.strategy)
                                or _work(out[j].job.strategy) < _work(a))]
                if lighter:
                    # the lightest one is itself undominated (the order is a partial order)
                    j = min(lighter, key=lambda k: _work(out[k].job.strategy))
                    out[i] = replace(out[i], status=Status.DOMINATED,
                                     reason=f"{out[j].key} fits and adds no work")
    return out


def _work(s: Strategy) -> tuple[int, int, int]:
    return (_RECOMPUTE_WORK[s.recompute], _OFFLOAD_WORK[s.offload], s.zero)
