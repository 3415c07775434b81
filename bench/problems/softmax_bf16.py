"""Row softmax over the last dimension in bf16 (transformer family: attention scores, sampling heads)."""
import torch
import torch.nn as nn

ROWS = 8192
COLS = 8192
SMALL = {"ROWS": 64, "COLS": 256}


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(ROWS, COLS).to(torch.bfloat16)]


def get_init_inputs():
    return []
