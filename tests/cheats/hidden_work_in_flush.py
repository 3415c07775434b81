"""Cheat: hide time between the measured calls. A TorchFunctionMode, entered at import and never left, intercepts
the harness's cache flush (zero_ on a large int8 buffer) and spends 0.1 s there (the harness now flushes with modes off), standing in for work moved out of
the timed region. Only the parent's wall clock sees it."""
import time

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode


class _HideInFlush(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.zero_ and args[0].dtype == torch.int8 and args[0].numel() >= 1 << 24:
            time.sleep(0.1)
        return func(*args, **(kwargs or {}))


_HideInFlush().__enter__()


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * self.scale + self.bias)
