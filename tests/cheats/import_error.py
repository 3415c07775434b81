"""Imports a module that does not exist."""
import torch
import torch.nn as nn

import kernelevolve_no_such_module  # noqa: F401


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x
