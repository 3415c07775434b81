"""A scaled, shifted GELU followed by a softmax over each row: the kind of pointwise chain and row reduction that
eager PyTorch runs as five kernels with a temporary between each, and one fused kernel can run in a single pass over
the data (Inductor on a CPU, a Triton row-reduction kernel on a GPU). KernelBench format."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.scale = nn.Parameter(torch.full((hidden,), 0.5))
        self.bias = nn.Parameter(torch.zeros(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(F.gelu(x * self.scale + self.bias), dim=-1)


ROWS, HIDDEN = 4096, 1024


def get_inputs():
    return [torch.randn(ROWS, HIDDEN)]


def get_init_inputs():
    return [HIDDEN]
