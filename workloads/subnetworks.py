"""Subnetwork Data Parallelism (SDP): each data-parallel replica trains a subnetwork of the model.

Singh, Khalid, Oyallon, Belilovsky, "Model Parallelism With Subnetwork Data Parallelism",
arXiv 2507.09029 (v4, 2025): the model is partitioned into structured subnetworks trained on
separate workers without exchanging activations; each worker stores and updates only its
subnetwork's parameters, so its weights, gradients and optimizer state shrink, and a
parameter's gradient is averaged only over the workers whose subnetwork holds it. Subnetworks
are built "ensuring uniform representation of each parameter" (v1 abstract) at block level
(whole residual blocks kept or dropped) or neuron level (a slice of each layer's width). The
abstract reports 30%-75% less memory per device (v4; 20-40% in v1's preliminary runs).

What is modelled here: block-level SDP with forward masking (a dropped block is skipped in the
forward and the backward, its residual passes through), the variant that also saves FLOPs and
activations. ``count`` subnetworks each keep ``layers`` consecutive transformer blocks,
subnetwork k starting at block k L / count (wrapping around), so each block lies in
count x layers / L subnetworks: the paper's uniform representation. The embedding, the final
norm and the LM head are in every subnetwork (a subnetwork is a complete network). Replicas
are assigned to subnetworks round-robin, dp / count each, so a block's gradients are reduced
over dp x layers / L replicas instead of dp. Backward masking (full forward, sparse backward)
and neuron-level subnetworks are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.hardware_specs.errors import SpecError
from clustersim.hardware_specs.fields import Fields


@dataclass(frozen=True, kw_only=True, slots=True)
class Subnetworks:
    """``strategy.subnetworks``: block-level SDP with forward masking."""

    count: int
    """Distinct subnetworks; the dp replicas are spread evenly over them."""
    layers: int
    """Transformer blocks each subnetwork keeps (of ``model.layers``)."""

    def keep_fraction(self, model_layers: int) -> float:
        """Share of the transformer blocks one replica holds and computes."""
        return self.layers / model_layers

    def block_replicas(self, replicas: int, model_layers: int) -> int:
        """Data-parallel replicas that hold one block (over which its gradients are reduced):
        replicas x layers / L."""
        return replicas * self.layers // model_layers

    def to_dict(self) -> dict:
        return {"count": self.count, "layers": self.layers}


def subnetworks_from_mapping(f: Fields) -> Subnetworks | None:
    """``strategy.subnetworks: {count: K, layers: n}``, or None when absent."""
    if not f.has("subnetworks"):
        return None
    sub = f.sub("subnetworks").only(("count", "layers"))
    out = Subnetworks(count=sub.integer("count", minimum=2), layers=sub.integer("layers", minimum=1))
    sub.done()
    return out


def check_subnetworks(sub: Subnetworks, model_layers: int, dp: int, pp: int, ep: int,
                      path: str) -> None:
    """The rules that keep every block equally represented and the replicas evenly assigned."""
    at = f"{path}.subnetworks"
    if pp != 1 or ep != 1:
        raise SpecError(at, f"needs pp=1 and ep=1 (each replica holds its subnetwork whole), "
                        f"got pp={pp}, ep={ep}")
    if sub.layers >= model_layers:
        raise SpecError(f"{at}.layers", f"{sub.layers} keeps every one of model.layers="
                        f"{model_layers}; expected fewer (plain data parallelism otherwise)")
    if dp % sub.count:
        raise SpecError(f"{at}.count", f"{sub.count} does not divide dp={dp} (replicas are "
                        "spread evenly over the subnetworks)")
    if model_layers % sub.count or (sub.count * sub.layers) % model_layers:
        raise SpecError(at, f"count={sub.count} must divide model.layers={model_layers} and "
                        f"count*layers = {sub.count * sub.layers} be a multiple of it, so that "
                        "every block lies in the same number of subnetworks")
