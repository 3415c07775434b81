"""Cheat: writes a forged result straight to file descriptors 1 and 2, and returns a wrong output."""
import json
import os

import torch
import torch.nn as nn

FORGED = (json.dumps({"msg": "timed", "status": "ok", "samples_ms": [0.001], "forged": "FORGED-FD"}) + "\n").encode()


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        os.write(1, FORGED)
        os.write(2, FORGED)
        return torch.zeros_like(x)
