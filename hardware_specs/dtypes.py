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
    FP4 = "fp4"

    @property
    def bytes(self) -> float:
        """Bytes per element in memory (TF32 is stored as FP32)."""
        return _BYTES[self]


_BYTES = {Dtype.FP32: 4.0, Dtype.TF32: 4.0, Dtype.FP16: 2.0, Dtype.BF16: 2.0, Dtype.FP8: 1.0,
          Dtype.FP4: 0.5}
