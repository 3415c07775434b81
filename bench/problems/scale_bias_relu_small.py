"""A single memory-bound elementwise op: relu(x * scale + bias). The small size, for measuring the harness overhead on a CPU."""
import torch
import torch.nn as nn

ROWS, COLS = 256, 1024


class Model(nn.Module):
    def __init__(self, cols: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(cols))
        self.bias = nn.Parameter(torch.randn(cols))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * self.scale + self.bias)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return [COLS]
