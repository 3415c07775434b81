"""A small problem and a Triton kernel for it, shared by the CPU and GPU export tests."""

PROBLEM = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, dim))

    def forward(self, x, y):
        return torch.relu(x * self.scale) + y


def get_inputs():
    return [torch.randn(64, 48), torch.randn(64, 48)]


def get_init_inputs():
    return [48]
'''
KERNEL = '''import torch
import triton
import triton.language as tl

{problem}

@triton.jit
def _fused(x_ptr, s_ptr, y_ptr, out_ptr, n, dim, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    s = tl.load(s_ptr + offs % dim, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x * s, 0.0) + y, mask=mask)


class ModelNew(Model):
    def forward(self, x, y):
        x, y = x.contiguous(), y.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        _fused[(triton.cdiv(n, 1024),)](x, self.scale, y, out, n, x.shape[-1], BLOCK=1024)
        return out
'''
