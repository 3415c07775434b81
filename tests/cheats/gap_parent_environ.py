"""Probe (not caught): the child's own environment is clean, but other processes of the same user, the evaluating
parent among them, expose theirs in /proc/<pid>/environ. Raises if the planted secret is readable anywhere."""
import os

import torch
import torch.nn as nn

SECRET = b"sk-test-secret"


def _leaks() -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if SECRET in f.read():
                    found.append(f"/proc/{pid}/environ")
        except OSError:
            pass
    return found


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        leaks = _leaks()
        if leaks:
            raise RuntimeError(f"secret readable in {leaks}")
        return torch.relu(x * self.scale + self.bias)
