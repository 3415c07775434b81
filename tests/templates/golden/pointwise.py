"""Candidate from kernelevolve's template proposer (defaults): pointwise."""


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
def k0_pointwise_kernel(in0_ptr, in1_ptr, in2_ptr, out0_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < 1320
    in0 = tl.load(in0_ptr + offs, mask=mask).to(tl.float32)
    in1 = tl.load(in1_ptr + offs, mask=mask).to(tl.float32)
    in2 = tl.load(in2_ptr + (offs % 40), mask=mask).to(tl.float32)
    t0 = tl.sigmoid(in0)
    t1 = (in1 * t0)
    t2 = (t1 + in2)
    tl.store(out0_ptr + offs, t2.to(tl.float32), mask=mask)


def k0_pointwise(in0, in1, in2):
    _dev = in0.device
    in0 = in0.contiguous(); in1 = in1.contiguous(); in2 = in2.contiguous(); 
    outs = (torch.empty([33, 40], dtype=torch.float32, device=_dev),)
    k0_pointwise_kernel[(_cdiv(1320, 1024),)](in0, in1, in2, *outs, BLOCK=1024,
        num_warps=4)
    return outs


# ---- the reference, verbatim from the problem file ------------------------------------------------------------


import torch, torch.nn as nn, torch.nn.functional as F

class Model(nn.Module):
    def forward(self, x, y, z):
        return x * torch.sigmoid(y) + z
def get_inputs(): return [torch.randn(33, 40), torch.randn(33, 40), torch.randn(1, 40)]
def get_init_inputs(): return []


# ---- end of reference -----------------------------------------------------------------------------------------


class ModelNew(Model):
    """Candidate from kernelevolve's template proposer (defaults): pointwise."""

    def forward(self, *args):
        if len(args) != 3 or not _kernelevolve_shapes_match(args):
            return super().forward(*args)  # shapes the kernels were not generated for: the reference path
        v_add, = k0_pointwise(args[1], args[0], args[2])
        return v_add


def _kernelevolve_state(module, *path):
    *owners, leaf = path  # a parameter or buffer by its state_dict name, looked up afresh on every call
    for part in owners:
        module = module._modules[part]
    found = module._parameters.get(leaf)
    return module._buffers[leaf] if found is None else found


def _kernelevolve_shapes_match(args):
    return (tuple(args[0].shape) == (33, 40) and args[0].dtype == torch.float32
            and tuple(args[1].shape) == (33, 40) and args[1].dtype == torch.float32
            and tuple(args[2].shape) == (1, 40) and args[2].dtype == torch.float32)
