"""A small fused-MLP block: Linear -> GELU -> scale + residual. KernelBench format."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.fc = nn.Linear(hidden, hidden)
        self.scale = nn.Parameter(torch.full((hidden,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.scale * torch.nn.functional.gelu(self.fc(x))


BATCH, HIDDEN = 256, 512


def get_inputs():
    return [torch.randn(BATCH, HIDDEN)]


def get_init_inputs():
    return [HIDDEN]
