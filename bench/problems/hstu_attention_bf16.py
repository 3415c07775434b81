"""HSTU pointwise attention, (silu(q k^T) / S * causal mask) v, in bf16 (transformer family: generative
recommenders, where SiLU replaces the softmax)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 4
HEADS = 8
SEQ = 2048
HEAD_DIM = 128
SMALL = {"BATCH": 1, "HEADS": 2, "SEQ": 64, "HEAD_DIM": 16}


class Model(nn.Module):
    def __init__(self, seq: int):
        super().__init__()
        self.seq = seq
        self.register_buffer("causal", torch.ones(seq, seq).tril().to(torch.bfloat16), persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        attn = F.silu(q @ k.transpose(-2, -1)) / self.seq * self.causal
        return attn @ v


def get_inputs():
    return [torch.randn(BATCH, HEADS, SEQ, HEAD_DIM).to(torch.bfloat16) for _ in range(3)]


def get_init_inputs():
    return [SEQ]
