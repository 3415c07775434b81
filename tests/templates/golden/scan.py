"""Candidate from kernelevolve's template proposer (defaults): scan."""


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
def k0_scan_rows(in0_ptr, in1_ptr, out_ptr, L: tl.constexpr, LIN: tl.constexpr, LOUT: tl.constexpr, INNER: tl.constexpr,
        BLOCK: tl.constexpr):
    o = tl.program_id(0).to(tl.int64) * 4 + tl.arange(0, 4)[:, None]
    i = 0
    carry = tl.full([4], 0, tl.float32)
    for start in range(0, L, BLOCK):
        p = start + tl.arange(0, BLOCK)[None, :]
        m = (o < 33) & (p < L)
        idx = (o * LIN + (L - 1 - p)) * INNER + i
        in0 = tl.load(in0_ptr + idx, mask=m).to(tl.float32)
        in1 = tl.load(in1_ptr + idx, mask=m).to(tl.int1)
        t0 = (in0 * in1)
        x = tl.where(m, (t0).to(tl.float32), 0)
        y = tl.cumsum(x, axis=1)
        y = y + carry[:, None]
        carry = carry + tl.sum(x, axis=1)
        tl.store(out_ptr + (o * LOUT + (L - 1 - p)) * INNER + i, y.to(tl.float32), mask=m)


def k0_scan(in0, in1):
    in0 = in0.contiguous(); in1 = in1.contiguous()
    out = torch.empty([33, 300], dtype=torch.float32, device=in0.device)
    k0_scan_rows[(9,)](in0, in1, out, L=300, LIN=300, LOUT=300, INNER=1,
        BLOCK=512, num_warps=4)
    return (out,)


# ---- the reference, verbatim from the problem file ------------------------------------------------------------


import torch, torch.nn as nn, torch.nn.functional as F

class Model(nn.Module):
    def forward(self, x, mask):
        return torch.cumsum((x * mask).flip(1), dim=1).flip(1)
def get_inputs(): return [torch.randn(33, 300), torch.randint(0, 2, (33, 300)).bool()]
def get_init_inputs(): return []


# ---- end of reference -----------------------------------------------------------------------------------------


class ModelNew(Model):
    """Candidate from kernelevolve's template proposer (defaults): scan."""

    def forward(self, *args):
        if len(args) != 2 or not _kernelevolve_shapes_match(args):
            return super().forward(*args)  # shapes the kernels were not generated for: the reference path
        v_flip_1, = k0_scan(args[0], args[1])
        return v_flip_1


def _kernelevolve_state(module, *path):
    *owners, leaf = path  # a parameter or buffer by its state_dict name, looked up afresh on every call
    for part in owners:
        module = module._modules[part]
    found = module._parameters.get(leaf)
    return module._buffers[leaf] if found is None else found


def _kernelevolve_shapes_match(args):
    return (tuple(args[0].shape) == (33, 300) and args[0].dtype == torch.float32
            and tuple(args[1].shape) == (33, 300) and args[1].dtype == torch.bool)
