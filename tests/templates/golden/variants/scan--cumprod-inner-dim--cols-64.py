"""Candidate from kernelevolve's template proposer (variant): scan."""


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
def k0_scan_mul(a, b):
    return a * b


@triton.jit
def k0_scan_cols(in0_ptr, out_ptr, L: tl.constexpr, LIN: tl.constexpr, LOUT: tl.constexpr, INNER: tl.constexpr,
        BLOCK: tl.constexpr):
    o = tl.program_id(0).to(tl.int64) // 1
    i = (tl.program_id(0) % 1) * 64 + tl.arange(0, 64)[None, :]
    carry = tl.full([64], 1, tl.float32)
    for start in range(0, L, BLOCK):
        p = start + tl.arange(0, BLOCK)[:, None]
        m = (p < L) & (i < INNER)
        idx = (o * LIN + p) * INNER + i
        in0 = tl.load(in0_ptr + idx, mask=m).to(tl.float32)
        t0 = (in0 * 0.5)
        t1 = (t0 + 0.75)
        x = tl.where(m, (t1).to(tl.float32), 1)
        y = tl.cumprod(x, axis=0)
        y = y * carry[None, :]
        carry = carry * tl.reduce(x, 0, k0_scan_mul)
        tl.store(out_ptr + (o * LOUT + p) * INNER + i, y.to(tl.float32), mask=m)


def k0_scan(in0):
    in0 = in0.contiguous()
    out = torch.empty([3, 40, 45], dtype=torch.float32, device=in0.device)
    k0_scan_cols[(3,)](in0, out, L=40, LIN=40, LOUT=40, INNER=45,
        BLOCK=32, num_warps=4)
    return (out,)


# ---- the reference, verbatim from the problem file ------------------------------------------------------------


import torch, torch.nn as nn, torch.nn.functional as F

class Model(nn.Module):
    def forward(self, x):
        return torch.cumprod(x * 0.5 + 0.75, dim=1)
def get_inputs(): return [torch.rand(3, 40, 45)]
def get_init_inputs(): return []


# ---- end of reference -----------------------------------------------------------------------------------------


class ModelNew(Model):
    """Candidate from kernelevolve's template proposer (variant): scan."""

    def forward(self, *args):
        if len(args) != 1 or not _kernelevolve_shapes_match(args):
            return super().forward(*args)  # shapes the kernels were not generated for: the reference path
        v_cumprod, = k0_scan(args[0])
        return v_cumprod


def _kernelevolve_state(module, *path):
    *owners, leaf = path  # a parameter or buffer by its state_dict name, looked up afresh on every call
    for part in owners:
        module = module._modules[part]
    found = module._parameters.get(leaf)
    return module._buffers[leaf] if found is None else found


def _kernelevolve_shapes_match(args):
    return (tuple(args[0].shape) == (3, 40, 45) and args[0].dtype == torch.float32)
