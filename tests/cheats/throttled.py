"""Sleeps 0.1 s on every 10th call once the correctness trials are over: the median must still show real calls."""
import time

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.randn(dim))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls > 20 and self.calls % 10 == 0:
            time.sleep(0.1)
        return torch.relu(x * self.scale + self.bias)
