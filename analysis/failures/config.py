"""The ``failures:`` section of a run config: failure model overrides, checkpoint and recovery.

```yaml
failures:
  model: llama3-405b-h100          # a catalog name, or {base: NAME, <FailureModel fields>}
  include_planned: true            # planned maintenance (the model's `maintenance` rate)
  days: 54                         # horizon (the CLI's --days wins)
  token_budget: 1.5e13             # tokens to train (default: what a healthy job trains in `days`)
  seed: 0
  step_time: 6.2 s                 # measured step time (default: the engine simulates the step)
  checkpoint: {policy: async, interval: young, storage: parallel-fs, save_time: 40 s, ...}
  recovery: {policy: restart, detection: 2 min, spare_nodes: 64, ...}
```
Every error names its field, e.g. ``failures.checkpoint.interval``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from clustersim.hardware_specs import SpecError
from clustersim.hardware_specs.failures import FailureModel, failure_model_from_mapping, without_planned
from clustersim.hardware_specs.fields import Fields
from clustersim.hardware_specs.units import Quantity
from clustersim.simulator.longrun.checkpointing import (
    CheckpointPolicy, CheckpointSetup, IntervalRule,
)
from clustersim.simulator.longrun.recovery import RecoveryKind, RecoveryPolicy

from clustersim.analysis.config import RunConfig

DEFAULT_DAYS = 30.0
MAX_DAYS = 3650.0
"""Ten years: well past any training run, and a bound on how long one study can take."""
MAX_NODES = 1_000_000

_RULES = {"young": IntervalRule.YOUNG, "young_daly": IntervalRule.YOUNG, "daly": IntervalRule.DALY}


@dataclass(frozen=True, kw_only=True)
class FailureStudySpec:
    model: FailureModel
    checkpoint: CheckpointSetup
    interval_rule: IntervalRule
    interval_s: float
    """The fixed interval (``interval_rule`` FIXED), or 0 when given in steps."""
    interval_steps: int = 0
    """The fixed interval in training steps (``interval_rule`` FIXED)."""
    recovery: RecoveryPolicy
    days: float
    token_budget: float | None
    """Tokens to train; None: a healthy job's tokens in ``days``."""
    seed: int
    step_time_s: float = 0.0
    """A measured healthy step time to use instead of the engine's (0: simulate the step)."""

    def to_dict(self) -> dict:
        return {"failure_model": self.model.name,
                "checkpoint_policy": self.checkpoint.policy.value,
                "interval_rule": self.interval_rule.value,
                "recovery": self.recovery.to_dict(), "days": self.days,
                "token_budget": self.token_budget, "seed": self.seed,
                "step_time_s": self.step_time_s or None}


def _model(f: Fields, config: RunConfig) -> FailureModel:
    base = config.cluster.failure_model
    value = f.raw("model", None)
    if value is None:
        return base
    if isinstance(value, str):
        return config.catalog.get("failure_models", value, f.at("model"))
    sub = f.sub("model")
    name = sub.text("base", "")
    if name:
        base = config.catalog.get("failure_models", name, sub.at("base"))
    return failure_model_from_mapping(sub, base)


def _interval(f: Fields) -> tuple[IntervalRule, float, int]:
    """(rule, fixed seconds, fixed steps) from ``young``, ``daly``, ``30 min`` or ``100 steps``."""
    value = f.raw("interval", "young")
    text = value.strip().lower() if isinstance(value, str) else ""
    if text in _RULES:
        return _RULES[text], 0.0, 0
    steps = text.removesuffix("steps").removesuffix("step").strip()
    if text.endswith(("step", "steps")) and steps.isascii() and steps.isdigit() and int(steps) > 0:
        return IntervalRule.FIXED, 0.0, int(steps)
    try:
        return IntervalRule.FIXED, f.quantity("interval", Quantity.TIME), 0
    except SpecError as err:
        raise SpecError(err.field, f"expected young, daly, a time such as 30 min or a number "
                        f"of steps such as 100 steps, got {value!r}") from None


def _checkpoint(f: Fields, config: RunConfig
                ) -> tuple[CheckpointSetup, tuple[IntervalRule, float, int]]:
    storage = config.cluster.checkpoint_storage
    if f.has("storage"):
        storage = config.catalog.get("memory_tiers", f.text("storage"), f.at("storage"))
    interval = _interval(f)
    setup = CheckpointSetup(
        policy=f.choice("policy", CheckpointPolicy, CheckpointPolicy.SYNC),
        storage=storage,
        node_storage_bandwidth=f.quantity("node_storage_bandwidth", Quantity.BANDWIDTH, 0.0,
                                          positive=False),
        save_time_s=f.quantity("save_time", Quantity.TIME, 0.0, positive=False),
        load_time_s=f.quantity("load_time", Quantity.TIME, 0.0, positive=False),
        peer_replicas=f.integer("peer_replicas", 1, minimum=1),
        persist_every=f.integer("persist_every", 10, minimum=1),
        tolerated_failures=f.integer("tolerated_failures", 1, minimum=1),
    )
    f.done()
    if setup.policy is CheckpointPolicy.REFT:
        _check_reft(f, setup, config)
    in_memory = setup.policy is CheckpointPolicy.IN_MEMORY
    if in_memory and setup.peer_replicas >= config.cluster.num_nodes:
        raise SpecError(f.at("peer_replicas"), f"{setup.peer_replicas} needs more than that many "
                        f"nodes; the job has {config.cluster.num_nodes}")
    return setup, interval


def _check_reft(f: Fields, setup: CheckpointSetup, config: RunConfig) -> None:
    """REFT shards over data-parallel peers on other nodes: it needs some, and more of them
    than the parity tolerates losing."""
    from clustersim.simulator.longrun.checkpoint_state import sharding_groups

    if config.job.strategy.dp < 2:
        raise SpecError(f.at("policy"), "reft shards the state over data-parallel peers; it "
                        f"needs strategy.dp >= 2, the job has dp={config.job.strategy.dp}")
    group = min(map(len, sharding_groups(config.job, config.cluster)))
    if setup.tolerated_failures >= group:
        raise SpecError(f.at("tolerated_failures"), f"{setup.tolerated_failures} must be below "
                        f"the nodes of a sharding group ({group}: the nodes holding one GPU's "
                        "data-parallel peers)")


_TIMES = {"detection": "detection_s", "drain": "drain_s", "reschedule": "reschedule_s",
          "hot_swap": "hot_swap_s", "process_restart": "process_restart_s",
          "warmup": "warmup_s", "repair_time": "repair_time_s",
          "evict_slow_after": "evict_slow_after_s"}


def _recovery(f: Fields, config: RunConfig) -> RecoveryPolicy:
    default = RecoveryPolicy()
    times = {attr: f.quantity(key, Quantity.TIME, getattr(default, attr), positive=False)
             for key, attr in _TIMES.items()}
    policy = RecoveryPolicy(
        kind=f.choice("policy", RecoveryKind, RecoveryKind.RESTART),
        spare_nodes=f.integer("spare_nodes", 0, minimum=0, maximum=MAX_NODES),
        min_replicas=f.integer("min_replicas", 1, minimum=1),
        **times,
    )
    f.done()
    dp = config.job.strategy.dp
    if policy.min_replicas > dp:
        raise SpecError(f.at("min_replicas"), f"{policy.min_replicas} exceeds strategy.dp={dp}")
    if policy.kind in (RecoveryKind.ELASTIC, RecoveryKind.REPLICA_FT) and dp < 2:
        raise SpecError(f.at("policy"), f"{policy.kind.value} needs strategy.dp >= 2 "
                        "(it continues on the surviving data-parallel replicas)")
    if policy.repair_time_s <= 0:
        raise SpecError(f.at("repair_time"), "expected a positive time")
    return policy


def failure_spec(config: RunConfig, days: float | None = None,
                 section: Mapping[str, Any] | None = None) -> FailureStudySpec:
    """The study spec of ``config`` (its ``failures`` section unless ``section`` is given)."""
    data = config.sections.get("failures", {}) if section is None else section
    f = Fields(data, "failures")
    model = _model(f, config)
    if not f.boolean("include_planned", True):
        model = without_planned(model)
    checkpoint, (rule, fixed, steps) = _checkpoint(f.sub("checkpoint"), config)
    recovery = _recovery(f.sub("recovery"), config)
    spec_days = f.number("days", DEFAULT_DAYS, minimum=1e-6, maximum=MAX_DAYS)
    budget = f.number("token_budget", minimum=1.0) if f.has("token_budget") else None
    seed = f.integer("seed", 0, minimum=0)
    step_time = f.quantity("step_time", Quantity.TIME, 0.0, positive=False)
    f.done()
    if model.unexpected_per_1000_node_days <= 0 and rule is not IntervalRule.FIXED:
        raise SpecError("failures.checkpoint.interval", "young and daly need a failure rate; "
                        "the model has none, give a fixed interval")
    return FailureStudySpec(model=model, checkpoint=checkpoint, interval_rule=rule,
                            interval_s=fixed, interval_steps=steps, recovery=recovery,
                            days=days if days is not None else spec_days,
                            token_budget=budget, seed=seed, step_time_s=step_time)
