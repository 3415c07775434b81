"""For problem_inplace: mutates its input exactly as the reference does, which is allowed there."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x += self.bias
        return x.mul(2)
