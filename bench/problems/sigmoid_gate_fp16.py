"""Fused pointwise chain x * sigmoid(y) + z with z broadcast from [1, N], fp16 (ads ranking family: gating of
feature-interaction outputs, as in MaskNet / gated DCN)."""
import torch
import torch.nn as nn

ROWS = 16384
COLS = 8192
SMALL = {"ROWS": 32, "COLS": 64}


class Model(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(y) + z


def get_inputs():
    return [torch.randn(ROWS, COLS).to(torch.float16), torch.randn(ROWS, COLS).to(torch.float16),
            torch.randn(1, COLS).to(torch.float16)]


def get_init_inputs():
    return []
