"""Cheat: spawns a helper process at import that outlives the call. Writes its pid to __PIDFILE__."""
import subprocess

import torch
import torch.nn as nn

_helper = subprocess.Popen(["sleep", "30"])
with open("__PIDFILE__", "w") as f:
    f.write(str(_helper.pid))


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * self.scale + self.bias)
