"""Forks a grandchild that sleeps forever, then hangs; writes "<own pid> <grandchild pid>" to __PIDFILE__."""
import os
import time

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pid = os.fork()
        if pid == 0:
            while True:
                time.sleep(1)
        with open("__PIDFILE__", "w") as f:
            f.write(f"{os.getpid()} {pid}")
        while True:
            pass
