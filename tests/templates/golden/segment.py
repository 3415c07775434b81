"""Candidate from kernelevolve's template proposer (defaults): segment_reduction."""


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
def k0_segment_kernel(src_ptr, idx_ptr, bnd_ptr, n_bnd, out0_ptr, N, D, stride_v, stride_d,
        BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr):
    bag = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
    start = tl.load(bnd_ptr + bag).to(tl.int64)
    end = tl.load(bnd_ptr + bag + 1, mask=bag + 1 < n_bnd, other=N).to(tl.int64)
    end = tl.minimum(end, N)
    start = tl.minimum(start, end)
    acc = tl.full([BLOCK_L, BLOCK_D], 0.0, tl.float32)
    for j in range(start, end, BLOCK_L):
        pos = j + tl.arange(0, BLOCK_L)
        lmask = pos < end
        src = pos
        row = tl.load(idx_ptr + src, mask=lmask, other=0).to(tl.int64)
        if EVEN_D:
            m2 = lmask[:, None]
        else:
            m2 = lmask[:, None] & dmask[None, :]
        x = tl.load(src_ptr + row[:, None] * stride_v + d[None, :] * stride_d, mask=m2, other=0.0)
        x = x.to(tl.float32)
        acc += x
    r = tl.sum(acc, 0)
    n = end - start
    r = tl.where(n == 0, 0.0, r)
    tl.store(out0_ptr + bag * D + d, r.to(tl.float32), mask=dmask)

def k0_segment(*inputs):
    src = inputs[0]
    idx = inputs[1]
    N = idx.numel()
    assert src.dim() == 2, 'the table must be 2-D'
    bnd = inputs[2]
    S = bnd.numel() - 0
    D = src.shape[1]
    outs = [torch.empty((S, D,), dtype=dt, device=src.device) for dt in (torch.float32, )]
    if S > 0 and D > 0:
        grid = (S, _cdiv(D, 32))
        k0_segment_kernel[grid](src, idx, bnd, bnd.numel(), outs[0], N, D, src.stride(0), src.stride(1),
            BLOCK_L=16, BLOCK_D=32, EVEN_D=D % 32 == 0,
            num_warps=4, num_stages=1)
    return tuple(outs)


# ---- the reference, verbatim from the problem file ------------------------------------------------------------


import torch, torch.nn as nn, torch.nn.functional as F

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.EmbeddingBag(100, 24, mode="sum")
    def forward(self, idx, offsets):
        return self.emb(idx, offsets)
def get_inputs():  # random bag sizes (empty ones too) with a fixed total: the shapes stay put
    cuts = torch.sort(torch.randint(0, 30, (8,))).values
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), cuts])
    return [torch.randint(0, 100, (30,)), offsets]
def get_init_inputs(): return []


# ---- end of reference -----------------------------------------------------------------------------------------


class ModelNew(Model):
    """Candidate from kernelevolve's template proposer (defaults): segment_reduction."""

    def forward(self, *args):
        if len(args) != 2 or not _kernelevolve_shapes_match(args):
            return super().forward(*args)  # shapes the kernels were not generated for: the reference path
        _s = [_kernelevolve_state(self, *path) for path in [('emb', 'weight')]]
        v_getitem, = k0_segment(_s[0], args[0], args[1])
        return v_getitem


def _kernelevolve_state(module, *path):
    *owners, leaf = path  # a parameter or buffer by its state_dict name, looked up afresh on every call
    for part in owners:
        module = module._modules[part]
    found = module._parameters.get(leaf)
    return module._buffers[leaf] if found is None else found


def _kernelevolve_shapes_match(args):
    return (tuple(args[0].shape) == (30,) and args[0].dtype == torch.int64
            and tuple(args[1].shape) == (9,) and args[1].dtype == torch.int64)
