"""Causal attention written out by hand, scores materialized, in fp16 (transformer family: the unfused attention of
older model code that flash attention replaces)."""
import math

import torch
import torch.nn as nn

BATCH = 4
HEADS = 16
SEQ = 2048
HEAD_DIM = 64
SMALL = {"BATCH": 1, "HEADS": 2, "SEQ": 64, "HEAD_DIM": 16}


class Model(nn.Module):
    def __init__(self, seq: int, head_dim: int):
        super().__init__()
        self.scale = 1.0 / math.sqrt(head_dim)
        self.register_buffer("future", torch.ones(seq, seq, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = (q @ k.transpose(-2, -1)) * self.scale
        scores = scores.masked_fill(self.future, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v


def get_inputs():
    return [torch.randn(BATCH, HEADS, SEQ, HEAD_DIM).to(torch.float16) for _ in range(3)]


def get_init_inputs():
    return [SEQ, HEAD_DIM]
