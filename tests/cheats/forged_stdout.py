"""Cheat: prints a forged result as JSON on stdout and stderr, and returns a wrong output."""
import json
import sys

import torch
import torch.nn as nn

FORGED = json.dumps({"msg": "output", "status": "ok", "speedup": 100.0, "runtime_ms": 0.001, "forged": "FORGED-PRINT"})


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        print(FORGED)
        print(FORGED, file=sys.stderr)
        return torch.zeros_like(x)
