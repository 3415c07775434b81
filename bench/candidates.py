"""Candidate sources for the benchmarks and GPU tests: genuine single-kernel implementations of scale_bias_relu."""

TORCH = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(cols))
        self.bias = nn.Parameter(torch.randn(cols))

    def forward(self, x):
        return torch.addcmul(self.bias, x, self.scale).clamp_min_(0)
'''

TRITON = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _scale_bias_relu_kernel(x_ptr, s_ptr, b_ptr, y_ptr, n, cols, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    c = offs % cols
    x = tl.load(x_ptr + offs, mask=mask)
    y = x * tl.load(s_ptr + c, mask=mask) + tl.load(b_ptr + c, mask=mask)
    tl.store(y_ptr + offs, tl.maximum(y, 0.0), mask=mask)


def scale_bias_relu(x, scale, bias):
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    BLOCK = 1024
    _scale_bias_relu_kernel[(triton.cdiv(n, BLOCK),)](x, scale, bias, y, n, x.shape[-1], BLOCK=BLOCK)
    return y


class ModelNew(nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(cols))
        self.bias = nn.Parameter(torch.randn(cols))

    def forward(self, x):
        return scale_bias_relu(x, self.scale, self.bias)
'''
