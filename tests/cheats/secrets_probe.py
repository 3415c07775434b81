"""Correct, but fails loudly if the secret the test planted is visible in its environment."""
import os

import torch
import torch.nn as nn

SECRET = "sk-test-secret"


def _leaks() -> list[str]:
    found = [k for k, v in os.environ.items() if SECRET in v]
    with open("/proc/self/environ", "rb") as f:
        if SECRET.encode() in f.read():
            found.append("/proc/self/environ")
    return found


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        leaks = _leaks()
        if leaks:
            raise RuntimeError(f"secret visible in {leaks}")
        return torch.relu(x * self.scale + self.bias)
