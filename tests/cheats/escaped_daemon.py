"""Cheat: a helper started in its own session whose parent exits at once. It is outside the process group; without
a subreaper it would also be nobody's child in the candidate process. Writes its pid to __PIDFILE__."""
import subprocess

import torch
import torch.nn as nn

subprocess.run(["sh", "-c", "setsid sleep 30 >/dev/null 2>&1 & echo $! > __PIDFILE__"], check=True)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * self.scale + self.bias)
