"""Candidate from kernelevolve's template proposer (variant): column_reduction."""


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
    rmask = rows < 24
    cbase = tl.arange(0, BLOCK_C)[None, :]
    c_lo = tl.program_id(1) * 64
    c_hi = tl.minimum(c_lo + 64, 200)
    acc_sum_1 = tl.full([BLOCK_R, BLOCK_C], 0.0, tl.float32)
    for c0 in range(c_lo, c_hi, BLOCK_C):
        cols = c0 + cbase
        cmask = cols < c_hi
        mask = rmask & cmask
        in0 = tl.load(in0_ptr + (rows) + cols * 24, mask=mask, other=0).to(tl.float32)
        acc_sum_1 = acc_sum_1 + tl.where(mask, in0, 0.0)
    v_sum_1 = tl.sum(acc_sum_1, axis=1)[:, None]
    tl.atomic_add(out0_ptr + (rows), (v_sum_1 + tl.zeros([BLOCK_R, 1], tl.float32)).to(tl.float32), mask=rmask)


def k0_row_reduction(x0):
    _dev = x0.device
    x0 = x0.contiguous()
    outs = (torch.zeros([24], dtype=torch.float32, device=_dev),)
    k0_row_reduction_kernel[(_cdiv(24, 32), 4)](x0, *outs, BLOCK_R=32, BLOCK_C=64,
        num_warps=4, num_stages=1)
    return outs


# ---- the reference, verbatim from the problem file ------------------------------------------------------------


import torch, torch.nn as nn, torch.nn.functional as F

class Model(nn.Module):
    def forward(self, x):
        return x.sum(dim=0)
def get_inputs(): return [torch.randn(200, 24)]
def get_init_inputs(): return []


# ---- end of reference -----------------------------------------------------------------------------------------


class ModelNew(Model):
    """Candidate from kernelevolve's template proposer (variant): column_reduction."""

    def forward(self, *args):
        if len(args) != 1 or not _kernelevolve_shapes_match(args):
            return super().forward(*args)  # shapes the kernels were not generated for: the reference path
        v_sum_1, = k0_row_reduction(args[0])
        return v_sum_1


def _kernelevolve_state(module, *path):
    *owners, leaf = path  # a parameter or buffer by its state_dict name, looked up afresh on every call
    for part in owners:
        module = module._modules[part]
    found = module._parameters.get(leaf)
    return module._buffers[leaf] if found is None else found


def _kernelevolve_shapes_match(args):
    return (tuple(args[0].shape) == (200, 24) and args[0].dtype == torch.float32)
