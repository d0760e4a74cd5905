"""Routing physics of a mixture-of-experts layer: how many tokens the busiest device's experts
compute, how many a capacity limit drops, and the bytes dispatch and combine move.

Sources:
- Routing as balls into bins: each of the N = tokens x top_k assignments of an expert-parallel
  group lands on an expert; with uniform routing an expert's load is Binomial(N, 1/E) and the
  busiest of n bins carries about N/n + sqrt(2 (N/n) ln n) for N >> n ln n (Raab & Steger,
  "Balls into Bins - A Simple and Tight Analysis", RANDOM 1998, Theorem 1). Across an
  expert-parallel group the devices meet at the combine all-to-all, so the device whose experts
  received the most tokens sets the pace (Megatron-Core's MoE docs: "load imbalance ... the
  slowest rank determines the step"). The expectation of that maximum is computed from the
  per-device load distributions (normal approximation of the binomials).
- Skewed popularity (``expert_skew``): expert probabilities log-normal with that coefficient of
  variation, placed on devices in a fixed pseudo-random order (seed 0); 0 is the uniform router
  that auxiliary balancing losses aim at (Switch Transformer, Fedus et al. 2021, sec. 2.2;
  DeepSeek-V3's auxiliary-loss-free balancing, arXiv 2412.19437 sec. 2.1.2) and that
  Megatron-Core's ``--moe-router-force-load-balancing`` draws (random router logits).
- Natural routing under an auxiliary balance loss (``balance: aux_loss``): Wang et al.,
  "Auxiliary-Loss-Free Load Balancing Strategy for Mixture-of-Experts" (arXiv 2408.15664),
  Table 2, measured MaxVio_global = (max_i Load_i - mean Load) / mean Load (their Eq. 4) of
  0.52 on their 3B model (64 routed experts, top-6, 200B tokens) and 0.72 on the 1B one, both
  trained with the auxiliary loss at coefficient alpha = 0.001 (sec. 4.1), the coefficient of
  the Qwen3 recipes (``moe_aux_loss_coeff`` 1e-3). The 3B figure, their larger model, sets the
  log-normal skew whose busiest of 64 experts is 1.52x the mean (:func:`skew_for_maxvio`); the
  skew then describes the popularity of any number of experts. It is a floor: MaxVio_global
  counts a whole validation set after training, while a step waits on each micro-batch's
  busiest device, and early in training routing is further from balance. The skew loads the
  busiest device's expert GEMMs; the all-to-alls still move the uniform volume.
- Capacity (GShard, Lepikhin et al. 2020 sec. 2.2; Switch Transformer eq. (4)): an expert keeps
  at most C = ceil(capacity_factor x N / E) tokens and drops the rest; Megatron-Core's
  ``--moe-expert-capacity-factor`` with ``--moe-pad-expert-input-to-capacity`` computes C rows
  for every expert; without a capacity factor routing is dropless (every token computed).
- Dispatch and combine (Megatron-Core ``MoEAlltoAllTokenDispatcher``): each device sends every
  token-expert pair whose expert lives elsewhere: tokens x hidden x bytes x top_k x (ep-1)/ep
  per device under uniform routing, the same back in the combine.
- Router, permute and unpermute kernels (Megatron-Core ``moe_utils.permute/unpermute``,
  Transformer Engine's fused ``moe_permute``): memory-bound; the router reads the FP32 logits
  for the softmax/top-k; permute gathers each token's hidden state once per chosen expert;
  unpermute reads them back and writes the probability-weighted sum.
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass

import numpy as np

from clustersim.hardware_specs import SpecError


class RouterBalance(enum.Enum):
    """What balances a router's expert choices."""

    UNIFORM = "uniform"
    """Every expert equally likely: forced balancing's random logits, or ``expert_skew``."""
    AUX_LOSS = "aux_loss"
    """Natural routing of a router trained with an auxiliary balance loss at coefficient 1e-3."""


BALANCE_MAXVIO: dict[RouterBalance, tuple[float, int]] = {
    RouterBalance.AUX_LOSS: (0.52, 64),
}
"""Measured MaxVio and the experts it was measured over (arXiv 2408.15664 Table 2, 3B model,
auxiliary loss alpha = 0.001)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MoeRouting:
    """How tokens reach experts; the defaults are dropless, uniformly balanced routing."""

    capacity_factor: float = 0.0
    """Tokens an expert keeps, as a multiple of the balanced share; 0: dropless."""
    pad_to_capacity: bool = False
    """Every expert computes its full capacity (Megatron's pad-expert-input-to-capacity)."""
    expert_skew: float = 0.0
    """Coefficient of variation of expert popularity; 0: uniform routing."""
    balance: RouterBalance = RouterBalance.UNIFORM
    """What balances the router; ``aux_loss`` sets the skew from a measured MaxVio."""

    @property
    def host_sync(self) -> bool:
        """Whether a MoE layer's forward has the host read its token counts from the device:
        all but padded routing, whose counts are the capacity. Megatron-Core's
        ``MoEAlltoAllTokenDispatcher.preprocess`` sets ``cuda_sync_point`` to
        ``before_ep_alltoall`` when dropless, ``before_permutation_1`` with a capacity but no
        padding, and ``no_sync`` only when padded to capacity (where the sync falls:
        ``workloads/strategies/expert.py``)."""
        return not self.pad_to_capacity

    @property
    def skew(self) -> float:
        """The coefficient of variation of expert popularity routing runs with."""
        if self.balance in BALANCE_MAXVIO:
            return skew_for_maxvio(*BALANCE_MAXVIO[self.balance])
        return self.expert_skew

    def check(self, path: str = "moe") -> "MoeRouting":
        if self.capacity_factor and self.capacity_factor < 1.0 / 64:
            raise SpecError(f"{path}.capacity_factor", f"expected 0 (dropless) or a positive "
                            f"factor, got {self.capacity_factor}")
        if self.pad_to_capacity and not self.capacity_factor:
            raise SpecError(f"{path}.pad_to_capacity", "needs a capacity_factor")
        if not 0.0 <= self.expert_skew <= 10.0:
            raise SpecError(f"{path}.expert_skew", f"expected 0 to 10, got {self.expert_skew}")
        if self.expert_skew and self.balance is not RouterBalance.UNIFORM:
            raise SpecError(f"{path}.expert_skew", f"set with balance: {self.balance.value}, "
                            f"which sets the skew itself")
        return self


@dataclass(frozen=True, slots=True)
class ExpertLoad:
    """Tokens one MoE layer's experts compute on the busiest device of an expert-parallel group."""

    tokens_per_expert: float
    """Rows of each local expert's GEMMs on the busiest device."""
    dropped_fraction: float
    """Share of token-expert assignments a capacity limit drops (0 when dropless)."""
    busiest_over_mean: float
    """The busiest device's load over the balanced load (1 when perfectly balanced)."""
    sent_per_token: float
    """Token copies each device sends in a dispatch, per token it routes: top_k dropless,
    fewer when a capacity drops some, experts x capacity / tokens when padded to it."""


def expert_probabilities(experts: int, skew: float) -> np.ndarray:
    """Per-expert routing probabilities: uniform, or log-normal with coefficient of variation
    ``skew`` at the normal quantiles, in a fixed pseudo-random expert order."""
    if skew <= 0:
        return np.full(experts, 1.0 / experts)
    sigma = math.sqrt(math.log(1.0 + skew * skew))
    quantiles = (np.arange(experts) + 0.5) / experts
    z = np.array([_normal_quantile(q) for q in quantiles])
    p = np.exp(sigma * z)
    p = p[np.random.default_rng(0).permutation(experts)]
    return p / p.sum()


@functools.lru_cache(maxsize=64)
def skew_for_maxvio(maxvio: float, experts: int) -> float:
    """The ``expert_skew`` whose busiest of ``experts`` experts carries ``1 + maxvio`` times the
    mean load: MaxVio as Wang et al. define it (arXiv 2408.15664 Eq. 4), inverted by bisection
    (the busiest expert's share grows monotonically with the skew)."""
    if maxvio <= 0:
        return 0.0
    if experts < 2:
        raise SpecError("experts", f"a MaxVio needs at least 2 experts, got {experts}")
    def busiest_excess(skew: float) -> float:
        return float(np.max(expert_probabilities(experts, skew))) * experts - 1.0

    lo, hi = 0.0, 10.0
    if busiest_excess(hi) < maxvio:
        raise SpecError("maxvio", f"{maxvio} exceeds what a skew of {hi} gives over "
                                  f"{experts} experts")
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if busiest_excess(mid) < maxvio else (lo, mid)
    return 0.5 * (lo + hi)


def expected_max_load(assignments: float, shares: np.ndarray) -> float:
    """E[max_d L_d], L_d ~ Binomial(assignments, shares[d]) taken independent: the busiest bin."""
    mean = assignments * shares
    sd = np.sqrt(np.maximum(assignments * shares * (1.0 - shares), 1e-12))
    top = float(np.max(mean + 8.0 * sd))
    lo = float(np.min(np.maximum(mean - 8.0 * sd, 0.0)))
    xs = np.linspace(lo, top, 4097)
    z = (xs[:, None] - mean[None, :]) / sd[None, :]
    cdf_all = np.prod(0.5 * (1.0 + _erf(z / math.sqrt(2.0))), axis=1)
    # E[X] = lo + integral over [lo, top] of P(X > x)
    return lo + float(np.trapezoid(1.0 - cdf_all, xs))


def raab_steger_max(assignments: float, bins: int) -> float:
    """The busiest of ``bins`` under uniform routing, N/n + sqrt(2 (N/n) ln n) (Raab & Steger
    1998, Theorem 1, for N >> n ln n)."""
    mean = assignments / bins
    return mean + math.sqrt(2.0 * mean * math.log(bins))


def expert_load(tokens: float, top_k: int, experts: int, ep: int,
                routing: MoeRouting = MoeRouting()) -> ExpertLoad:
    """Load of the busiest device when each of ``ep`` devices routes ``tokens`` tokens to
    ``top_k`` of ``experts`` experts, ``experts / ep`` of them local to each device. A capacity
    applies to each source device's tokens, as Megatron-Core's ``get_capacity(num_local_tokens
    x top_k, experts, capacity_factor)`` does before the dispatch."""
    local = experts // ep
    sent = tokens * top_k
    assignments = sent * ep
    balanced = assignments / experts
    p = expert_probabilities(experts, routing.skew)
    dropped, capacity = 0.0, 0
    if routing.capacity_factor:
        capacity = math.ceil(routing.capacity_factor * sent / experts)
        dropped = float(np.sum(_excess(sent, p, capacity))) / sent
        if routing.pad_to_capacity:
            rows = float(ep * capacity)
            return ExpertLoad(rows, dropped, rows / balanced, experts * capacity / tokens)
    kept = top_k * (1.0 - dropped)
    if ep == 1:
        busiest = balanced * (1.0 - dropped)
        return ExpertLoad(busiest, dropped, 1.0 - dropped, kept)
    shares = p.reshape(ep, local).sum(axis=1)
    device = expected_max_load(assignments, shares)
    if capacity:
        device = min(device, local * ep * capacity)
    per_expert = device / local
    return ExpertLoad(per_expert, dropped, per_expert / balanced, kept)


def dispatch_bytes(tokens: float, hidden: int, elem_bytes: float, top_k: int, ep: int,
                   dropped_fraction: float = 0.0) -> float:
    """Bytes one device sends in a dispatch (and receives back in the combine) all-to-all:
    tokens x hidden x bytes x top_k x (ep-1)/ep, less what a capacity limit drops."""
    return tokens * hidden * elem_bytes * top_k * (ep - 1) / ep * (1.0 - dropped_fraction)


def all_to_all_buffer_bytes(tokens: float, hidden: int, elem_bytes: float, top_k: int,
                            dropped_fraction: float = 0.0) -> float:
    """The all-to-all's buffer on each device (its local share included, as NCCL counts it);
    the network model moves (ep-1)/ep of it, which is :func:`dispatch_bytes`."""
    return tokens * hidden * elem_bytes * top_k * (1.0 - dropped_fraction)


def _excess(n: float, p: np.ndarray, capacity: float) -> np.ndarray:
    """E[max(0, L - C)] for L ~ Binomial(n, p) (normal approximation)."""
    mean = n * p
    sd = np.sqrt(np.maximum(n * p * (1.0 - p), 1e-12))
    z = (capacity - mean) / sd
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    tail = 0.5 * (1.0 - _erf(z / math.sqrt(2.0)))
    return (mean - capacity) * tail + sd * pdf


def _erf(x: np.ndarray) -> np.ndarray:
    """erf to 1.5e-7 (Abramowitz & Stegun 7.1.26), vectorised."""
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027
                                                                          + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-a * a))


def _normal_quantile(q: float) -> float:
    """Inverse standard normal CDF by bisection on math.erf (only used for a few hundred
    experts)."""
    lo, hi = -10.0, 10.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if 0.5 * (1.0 + math.erf(mid / math.sqrt(2.0))) < q:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
