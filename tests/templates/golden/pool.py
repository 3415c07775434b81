"""Candidate from kernelevolve's template proposer (defaults): pool."""


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
def k0_pool_kernel(in0_ptr, out_ptr, BLOCK: tl.constexpr):
    q = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = q < 540
    o1 = q % 10
    o0 = (q // 10) % 9
    nc = ((q // 10) // 9)
    s0 = o0 * 2 - 1
    s1 = o1 * 2 - 1
    acc = tl.full([BLOCK], 0.0, tl.float32)
    for t in tl.static_range(9):
        w1 = (t // 1) % 3
        w0 = (t // 3) % 3
        p0 = s0 + w0 * 1
        p1 = s1 + w1 * 1
        m = live & (p0 >= 0) & (p0 < 17) & (p1 >= 0) & (p1 < 20)
        idx = ((nc) * 17 + p0) * 20 + p1
        in0 = tl.load(in0_ptr + idx, mask=m).to(tl.float32)
        t0 = tl.maximum(in0, 0.0)
        acc += tl.where(m, (t0).to(tl.float32), 0.0)
    acc = acc / ((tl.minimum(tl.minimum(s0 + 3, 18), 17) - tl.maximum(s0, 0)) * (tl.minimum(tl.minimum(s1 + 3, 21), 20) - tl.maximum(s1, 0))).to(tl.float32)
    tl.store(out_ptr + q, acc.to(tl.float32), mask=live)


def k0_pool(in0):
    in0 = in0.contiguous()
    out = torch.empty([2, 3, 9, 10], dtype=torch.float32, device=in0.device)
    k0_pool_kernel[(3,)](in0, out, BLOCK=256, num_warps=4)
    return (out,)


# ---- the reference, verbatim from the problem file ------------------------------------------------------------


import torch, torch.nn as nn, torch.nn.functional as F

class Model(nn.Module):
    def forward(self, x):
        return F.avg_pool2d(torch.relu(x), 3, stride=2, padding=1, count_include_pad=False)
def get_inputs(): return [torch.randn(2, 3, 17, 20)]
def get_init_inputs(): return []


# ---- end of reference -----------------------------------------------------------------------------------------


class ModelNew(Model):
    """Candidate from kernelevolve's template proposer (defaults): pool."""

    def forward(self, *args):
        if len(args) != 1 or not _kernelevolve_shapes_match(args):
            return super().forward(*args)  # shapes the kernels were not generated for: the reference path
        v_avg_pool2d, = k0_pool(args[0])
        return v_avg_pool2d


def _kernelevolve_state(module, *path):
    *owners, leaf = path  # a parameter or buffer by its state_dict name, looked up afresh on every call
    for part in owners:
        module = module._modules[part]
    found = module._parameters.get(leaf)
    return module._buffers[leaf] if found is None else found


def _kernelevolve_shapes_match(args):
    return (tuple(args[0].shape) == (2, 3, 17, 20) and args[0].dtype == torch.float32)
