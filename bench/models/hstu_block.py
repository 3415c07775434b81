"""HSTU block (Hierarchical Sequential Transduction Unit, generative recommenders), inference, fp32.

A dense padded batch of user sequences x [64, 256, 256] with lengths [64] (1..256): layernorm, one fused linear
(256 -> 4 x 256) giving U, V, Q, K, SiLU on all four; 4 heads of 64; pointwise attention
SiLU(Q K^T + relative position bias) / N (no softmax) under a causal mask that also drops padded keys; output
layernorm(attn @ V) * U, a linear (256 -> 256) and the residual. Batch 64, N = 256, D = 256.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 64
SEQ = 256
DIM = 256
HEADS = 4
SMALL = {"BATCH": 4, "SEQ": 16, "DIM": 32, "HEADS": 2}


class Model(nn.Module):
    def __init__(self, seq, dim, heads):
        super().__init__()
        self.seq, self.dim, self.heads = seq, dim, heads
        self.norm_in = nn.LayerNorm(dim)
        self.uvqk = nn.Linear(dim, 4 * dim)
        self.norm_attn = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, dim)
        # one learned bias per head and relative distance i - j, read through a fixed [N, N] index
        self.rel_bias = nn.Parameter(torch.randn(heads, 2 * seq - 1) * 0.02)
        pos = torch.arange(seq)
        self.register_buffer("rel_index", (pos.unsqueeze(1) - pos.unsqueeze(0) + seq - 1), persistent=False)
        self.register_buffer("causal", torch.ones(seq, seq, dtype=torch.bool).tril(), persistent=False)
        self.register_buffer("positions", pos, persistent=False)

    def forward(self, x, lengths):
        b, n, d = x.shape
        h = self.heads
        u, v, q, k = F.silu(self.uvqk(self.norm_in(x))).split(d, dim=-1)
        q = q.view(b, n, h, d // h).transpose(1, 2)  # [B, H, N, dh]
        k = k.view(b, n, h, d // h).transpose(1, 2)
        v = v.view(b, n, h, d // h).transpose(1, 2)
        bias = self.rel_bias[:, self.rel_index]  # [H, N, N]
        scores = F.silu(torch.matmul(q, k.transpose(-2, -1)) + bias) / self.seq
        valid = self.positions.unsqueeze(0) < lengths.unsqueeze(1)  # [B, N] keys that are not padding
        mask = self.causal.unsqueeze(0) & valid.unsqueeze(1)  # [B, N, N]
        scores = scores * mask.unsqueeze(1).to(scores.dtype)
        attn = torch.matmul(scores, v).transpose(1, 2).reshape(b, n, d)
        return x + self.out(self.norm_attn(attn) * u)


def get_inputs():
    return [torch.randn(BATCH, SEQ, DIM), torch.randint(1, SEQ + 1, (BATCH,))]


def get_init_inputs():
    return [SEQ, DIM, HEADS]
