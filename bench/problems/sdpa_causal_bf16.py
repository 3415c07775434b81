"""Causal scaled-dot-product attention through F.scaled_dot_product_attention in bf16 (transformer family: GPT-style
self-attention at 2k context)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 4
HEADS = 16
SEQ = 2048
HEAD_DIM = 64
SMALL = {"BATCH": 1, "HEADS": 2, "SEQ": 64, "HEAD_DIM": 16}


class Model(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def get_inputs():
    return [torch.randn(BATCH, HEADS, SEQ, HEAD_DIM).to(torch.bfloat16) for _ in range(3)]


def get_init_inputs():
    return []
