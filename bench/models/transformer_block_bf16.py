"""Pre-norm transformer block (sequence encoder of a ranking model, LLaMA-style), inference, bf16.

x [8, 1024, 1024]: RMSNorm, fused QKV projection (1024 -> 3072, no bias), 16 heads of 64 through
F.scaled_dot_product_attention(is_causal=True), output projection and residual; RMSNorm, SwiGLU MLP (gate and up
1024 -> 2816, down 2816 -> 1024, no bias) and residual. Parameters and inputs bf16. Batch 8, S = 1024, D = 1024.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8
SEQ = 1024
DIM = 1024
HEADS = 16
FFN = 2816
SMALL = {"BATCH": 2, "SEQ": 16, "DIM": 32, "HEADS": 4, "FFN": 48}


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.to(x.dtype) * self.weight


class Model(nn.Module):
    def __init__(self, dim, heads, ffn):
        super().__init__()
        self.heads = heads
        self.norm_attn = RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.norm_mlp = RMSNorm(dim)
        self.gate = nn.Linear(dim, ffn, bias=False)
        self.up = nn.Linear(dim, ffn, bias=False)
        self.down = nn.Linear(ffn, dim, bias=False)
        self.to(torch.bfloat16)

    def forward(self, x):
        b, s, d = x.shape
        h = self.heads
        qkv = self.qkv(self.norm_attn(x)).view(b, s, 3, h, d // h).permute(2, 0, 3, 1, 4)  # [3, B, H, S, dh]
        attn = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, d))
        y = self.norm_mlp(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


def get_inputs():
    return [torch.randn(BATCH, SEQ, DIM, dtype=torch.bfloat16)]


def get_init_inputs():
    return [DIM, HEADS, FFN]
