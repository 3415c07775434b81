"""Cheat: mutates its input, and tries to hide it from the harness's comparison with a
TorchFunctionMode, entered at import and never left, under which torch.equal always answers True."""
import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode


class _Blind(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.equal:
            return True
        return func(*args, **(kwargs or {}))


_Blind().__enter__()


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul_(self.scale).add_(self.bias).clamp_(min=0)
