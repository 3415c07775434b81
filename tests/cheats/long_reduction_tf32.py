"""Cheat: a TF32 product where the problem does not allow TF32. The operands are rounded to TF32's 10-bit mantissa,
which is what the tensor cores do to fp32 inputs (emulated here, so that it runs on the CPU too)."""
import torch
import torch.nn as nn


def _tf32(t: torch.Tensor) -> torch.Tensor:
    return (t.contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return _tf32(x) @ _tf32(w)
