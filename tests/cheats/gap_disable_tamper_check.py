"""Cheat (not caught): every check that runs inside the candidate's process can be switched off by the candidate.
Here the tamper check is replaced by one that finds nothing, then the timing loop's clock runs a hundred times slow."""
import sys

import torch
import torch.nn as nn

sys.modules["kernelevolve.evaluate.checks"].tampered = lambda before: []
_timing = sys.modules["kernelevolve.evaluate.timing"]
_real = _timing._perf
_timing._perf = lambda: _real() / 100


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * self.scale + self.bias)
