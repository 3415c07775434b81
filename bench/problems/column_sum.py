"""Column reduction, sum over dim 0 of a tall fp32 matrix (ads ranking family: batch statistics and bias gradients
over a large batch)."""
import torch
import torch.nn as nn

ROWS = 65536
COLS = 1024
SMALL = {"ROWS": 64, "COLS": 32}


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=0)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
