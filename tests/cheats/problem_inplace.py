"""A problem whose reference mutates its input in place: x += bias, then returns 2 * x."""
import torch
import torch.nn as nn

DIM = 128


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.add_(self.bias)
        return x * 2


def get_inputs():
    return [torch.randn(64, DIM)]


def get_init_inputs():
    return [DIM]
