"""A large elementwise problem: 256 MB in and 256 MB out (fp32), for the harness's own costs that grow with the data.
ELEMENTS is rewritten by the GPU tests for several GB."""
import torch
import torch.nn as nn

ELEMENTS = 64 << 20


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2.0 + 1.0)


def get_inputs():
    return [torch.randn(ELEMENTS)]


def get_init_inputs():
    return []
