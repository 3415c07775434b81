"""A tiny problem for the evaluator's tests: y = relu(x * scale + bias), fast on the CPU and under the Triton interpreter."""
import torch
import torch.nn as nn

DIM = 128


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * self.scale + self.bias)


def get_inputs():
    return [torch.randn(64, DIM)]


def get_extra_inputs():
    return [[torch.randn(3, DIM)]]  # an odd second shape, checked on every trial


def get_init_inputs():
    return [DIM]
