"""What the host spends issuing one kernel eagerly (PyTorch without CUDA graphs).

An eager PyTorch op costs the host its Python module call, the dispatcher's translation to an
ATen kernel and the CUDA launch, before the device can run it. Transformer Engine issue #2053
(NVIDIA/TransformerEngine, 2025-08, "High CPU overhead on Grace systems") measured that host
time for one BF16 ``torch.nn.Linear`` forward (hidden 2,048, 8,192 tokens: one cuBLAS GEMM
kernel) on three hosts: 13.48 us of CPU time per call on a DGX H100 (Xeon Platinum 8480C),
33.17 us on GH200 and 37.08 us on GB200 (Grace, Arm Neoverse V2). Each node carries its
host's figure (``NodeSpec.eager_issue_s``, the DGX H100's where no host was measured); it is
the cost charged per kernel launch of an op issued eagerly.

Not modelled: TE modules cost more per call than one kernel each (the same issue measured TE's
``Linear`` at 2.7x torch's on Grace).
"""

from __future__ import annotations

EAGER_ISSUE_S = 13.48e-6
"""Host seconds per kernel issued eagerly: one ``torch.nn.Linear`` forward (one GEMM kernel)
on a DGX H100's Xeon Platinum 8480C (TransformerEngine issue #2053, 2025-08); the nodes'
default."""


def issue_time(launches: int, per_launch_s: float, slow_host_s: float = 0.0) -> float:
    """Host time to issue ``launches`` kernels eagerly at the node's ``per_launch_s``; a slow
    host (``Faults``' ``launch_overhead_s``) costs its own time per launch where that is
    longer."""
    return launches * max(per_launch_s, slow_host_s)
