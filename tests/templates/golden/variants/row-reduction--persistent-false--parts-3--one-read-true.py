"""Candidate from kernelevolve's template proposer (variant): row_reduction."""


import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _erf(x):
    return tl.erf(x)


@triton.jit
def _powf(a, b):
    return tl.exp2(b * tl.log2(a))


@triton.jit
def _fmod(a, b):
    return libdevice.fmod(a, b)


@triton.jit
def _atan2(a, b):
    return libdevice.atan2(a, b)


def _cdiv(a, b):
    return -(-a // b)  # launch grids in plain integers (triton.cdiv is a constexpr function in recent Triton)


@triton.jit
def k0_row_reduction_kernel(in0_ptr, out0_ptr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
    rmask = rows < 17
    cbase = tl.arange(0, BLOCK_C)[None, :]
    acc_amax = tl.full([BLOCK_R, 1], float('-inf'), tl.float32)
    acc_sum_1 = tl.zeros([BLOCK_R, 1], tl.float32)
    for c0 in range(0, 300, BLOCK_C):
        cols = c0 + cbase
        cmask = cols < 300
        mask = rmask & cmask
        in0 = tl.load(in0_ptr + (rows * 300) + cols, mask=mask, other=0).to(tl.float32)
        m_new = tl.maximum(acc_amax, tl.max(tl.where(mask, in0, float('-inf')), axis=1)[:, None])
        m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)
        acc_sum_1 = acc_sum_1 * tl.exp(acc_amax - m_safe) + tl.sum(tl.where(mask, tl.exp(in0 - m_safe), 0.0), axis=1)[:, None]
        acc_amax = m_new
    for c0 in range(0, 300, BLOCK_C):
        cols = c0 + cbase
        cmask = cols < 300
        mask = rmask & cmask
        in0 = tl.load(in0_ptr + (rows * 300) + cols, mask=mask, other=0).to(tl.float32)
        v_sub = (in0 - acc_amax)
        v_exp = tl.exp(v_sub)
        v_div = (v_exp / acc_sum_1)
        tl.store(out0_ptr + (rows * 300) + cols, (v_div + tl.zeros([BLOCK_R, BLOCK_C], tl.float32)).to(tl.float32), mask=mask)


def k0_row_reduction(x0):
    _dev = x0.device
    x0 = x0.contiguous()
    outs = (torch.empty([17, 300], dtype=torch.float32, device=_dev),)
    k0_row_reduction_kernel[(_cdiv(17, 16), 1)](x0, *outs, BLOCK_R=16, BLOCK_C=512,
        num_warps=8, num_stages=1)
    return outs


# ---- the reference, verbatim from the problem file ------------------------------------------------------------


import torch, torch.nn as nn, torch.nn.functional as F

class Model(nn.Module):
    def forward(self, x):
        return F.softmax(x, dim=-1)
def get_inputs(): return [torch.randn(17, 300)]
def get_init_inputs(): return []


# ---- end of reference -----------------------------------------------------------------------------------------


class ModelNew(Model):
    """Candidate from kernelevolve's template proposer (variant): row_reduction."""

    def forward(self, *args):
        if len(args) != 1 or not _kernelevolve_shapes_match(args):
            return super().forward(*args)  # shapes the kernels were not generated for: the reference path
        v_div, = k0_row_reduction(args[0])
        return v_div


def _kernelevolve_state(module, *path):
    *owners, leaf = path  # a parameter or buffer by its state_dict name, looked up afresh on every call
    for part in owners:
        module = module._modules[part]
    found = module._parameters.get(leaf)
    return module._buffers[leaf] if found is None else found


def _kernelevolve_shapes_match(args):
    return (tuple(args[0].shape) == (17, 300) and args[0].dtype == torch.float32)
