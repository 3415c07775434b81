"""A chain of pointwise ops and a row reduction: scale and shift, SiLU, then a LayerNorm without affine terms.
KernelBench format. On a CPU, Inductor fuses the chain into one pass over each row; on a GPU, the row-reduction
templates claim it."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, width))
        self.shift = nn.Parameter(torch.linspace(-0.1, 0.1, width))

    def forward(self, x):
        y = x * self.scale + self.shift
        y = y * torch.sigmoid(y)
        mean = y.mean(dim=-1, keepdim=True)
        var = ((y - mean) ** 2).mean(dim=-1, keepdim=True)
        return (y - mean) * torch.rsqrt(var + 1e-5)


ROWS, WIDTH = 1024, 2048


def get_inputs():
    return [torch.randn(ROWS, WIDTH)]


def get_init_inputs():
    return [WIDTH]
