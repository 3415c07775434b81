"""Softmax over very wide rows, fp32: 256 rows of 400,000 values (a ranking model's scores over a whole candidate
set). Too wide for one program to hold a row, too few rows for one program per row to fill the GPU."""
import torch
import torch.nn as nn

ROWS = 256
COLS = 400_000
SMALL = {"ROWS": 3, "COLS": 20_000}


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(ROWS, COLS) * 4]


def get_init_inputs():
    return []
