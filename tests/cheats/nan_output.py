"""One NaN in an output where the reference has none (NaN compares false, so a careless allclose passes it)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x * self.scale + self.bias)
        y[-1, -1] = float("nan")
        return y
