"""Numeric formats: their storage size and the names the catalog uses for their peak rates."""

from __future__ import annotations

import enum


class Dtype(enum.Enum):
    """An arithmetic format with its own peak rate on a device (dense, no sparsity)."""

    FP32 = "fp32"
    TF32 = "tf32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    """FP8 (E4M3/E5M2) with per-tensor scales (Hopper's Transformer Engine; "FP8-CS" in NVIDIA's
    tables)."""
    MXFP8 = "mxfp8"
    """OCP Microscaling FP8 (MX spec v1.0): E4M3/E5M2 elements with one E8M0 scale per block of 32,
    applied by Blackwell's tensor cores (at the FP8 rate; Hopper has no MX instructions)."""
    FP4 = "fp4"
    NVFP4 = "nvfp4"
    """NVIDIA's FP4: E2M1 elements with one E4M3 scale per block of 16 and one FP32 scale per
    tensor (Blackwell tensor cores)."""

    @property
    def bytes(self) -> float:
        """Bytes per element in memory (TF32 is stored as FP32)."""
        return _BYTES[self]


_BYTES = {Dtype.FP32: 4.0, Dtype.TF32: 4.0, Dtype.FP16: 2.0, Dtype.BF16: 2.0, Dtype.FP8: 1.0,
          Dtype.MXFP8: 1.0 + 1 / 32, Dtype.FP4: 0.5, Dtype.NVFP4: 0.5 + 1 / 16}
"""Block-scaled formats carry their scales: MXFP8 one byte per 32 elements, NVFP4 one byte per 16."""
