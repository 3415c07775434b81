"""Cheat: starts a background thread in forward that keeps running after the call returns."""
import threading
import time

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        return torch.relu(x * self.scale + self.bias)
