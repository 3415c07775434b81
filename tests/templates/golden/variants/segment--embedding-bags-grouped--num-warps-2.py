"""Candidate from kernelevolve's template proposer (variant): segment_reduction."""


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
def k0_segment_one(src_ptr, idx_ptr, bnd_ptr, n_bnd, out0_ptr, N, D, stride_v, stride_d, bag, d, dmask,
        BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr):
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

@triton.jit
def k0_segment_kernel(meta_ptr, out0, out1, out2, D, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
        UNIT_D: tl.constexpr, ALIGNED: tl.constexpr):
    bag = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
    t = tl.program_id(2)
    m = meta_ptr + t * 8
    if bag < tl.load(m + 5):
        src = tl.load(m).to(tl.pointer_type(tl.float32))
        sv = tl.load(m + 6)
        if ALIGNED:  # every table 16-byte aligned with rows a multiple of 16 elements apart: vector loads
            src = tl.multiple_of(src, 16)
            sv = tl.multiple_of(sv, 16)
        if UNIT_D:
            sd = 1
        else:
            sd = tl.load(m + 7)
        nb = tl.load(m + 3)
        n = tl.load(m + 4)
        out = out0
        if t == 1:
            out = out1
        elif t == 2:
            out = out2
        idx = tl.load(m + 1).to(tl.pointer_type(tl.int64))
        bnd = tl.load(m + 2).to(tl.pointer_type(tl.int64))
        k0_segment_one(src, idx, bnd, nb, out, n, D, sv, sd, bag, d, dmask, BLOCK_L, BLOCK_D, EVEN_D)

k0_segment_layouts = {}


def k0_segment_layout(srcs, idxs, bnds, S):
    """The kernel's layout tensor for these tables, indices and offsets, with its UNIT_D and ALIGNED flags; kept per
    layout, so a call on the same tensors (a model's weights, a loop's input buffers) copies nothing to the device.
    A layout first used while a CUDA graph is captured is kept for good: the graph reads it on every replay."""
    # the key in three sweeps of tensor methods with no Python loop (a call's host time is mostly such small steps)
    ptrs = tuple(map(torch.Tensor.data_ptr, srcs + idxs + bnds))
    counts = tuple(map(torch.Tensor.numel, idxs + bnds))
    strides = tuple(map(torch.Tensor.stride, srcs))
    key = (ptrs, counts, strides)
    hit = k0_segment_layouts.get(key)
    capturing = srcs[0].is_cuda and torch.cuda.is_current_stream_capturing()
    if hit is None:
        n = len(srcs)
        vals = []
        for t in range(n):
            vals += [ptrs[t], ptrs[n + t], ptrs[2 * n + t], counts[n + t], counts[t], S[t], *strides[t]]
        host = torch.tensor(vals, dtype=torch.int64)
        meta = host.pin_memory().to(srcs[0].device, non_blocking=True) if srcs[0].is_cuda else host
        unit_d = all(sd == 1 for _, sd in strides)
        aligned = all(p % 16 == 0 and sv % 16 == 0 for p, (sv, _) in zip(ptrs, strides))
        loose = [k for k, v in k0_segment_layouts.items() if not v[3]]
        if len(loose) >= 64:
            del k0_segment_layouts[loose[0]]
        hit = k0_segment_layouts[key] = [meta, unit_d, aligned, capturing, host]
    hit[3] = hit[3] or capturing
    return hit[0], hit[1], hit[2]


def k0_segment(*inputs):
    srcs = [inputs[k] for k in [0, 3, 6]]
    idxs = [inputs[1], inputs[4], inputs[7]]
    bnds = [inputs[2], inputs[5], inputs[8]]
    D = srcs[0].shape[1]
    S = [b.numel() - 0 for b in bnds]
    outs = [torch.empty((s, D), dtype=torch.float32, device=srcs[0].device) for s in S]
    if max(S) > 0 and D > 0:
        meta, unit_d, aligned = k0_segment_layout(srcs, idxs, bnds, S)
        k0_segment_kernel[(max(S), _cdiv(D, 32), 3)](meta, *outs, D, BLOCK_L=16, BLOCK_D=32,
            EVEN_D=D % 32 == 0, UNIT_D=unit_d, ALIGNED=aligned, num_warps=2, num_stages=1)
    return tuple(outs)


# ---- the reference, verbatim from the problem file ------------------------------------------------------------


import torch, torch.nn as nn, torch.nn.functional as F

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.tables = nn.ModuleList(nn.EmbeddingBag(n, 24, mode="sum") for n in (100, 60, 80))
    def forward(self, i0, o0, i1, o1, i2, o2):
        return torch.stack([t(i, o) for t, i, o in zip(self.tables, (i0, i1, i2), (o0, o1, o2))], 1)
def get_inputs():  # three bags of eight, each table with its own indices and random bag sizes
    out = []
    for rows in (100, 60, 80):
        cuts = torch.sort(torch.randint(0, 30, (7,))).values
        out += [torch.randint(0, rows, (30,)), torch.cat([torch.zeros(1, dtype=torch.long), cuts])]
    return out
def get_init_inputs(): return []


# ---- end of reference -----------------------------------------------------------------------------------------


class ModelNew(Model):
    """Candidate from kernelevolve's template proposer (variant): segment_reduction."""

    def forward(self, *args):
        if len(args) != 6 or not _kernelevolve_shapes_match(args):
            return super().forward(*args)  # shapes the kernels were not generated for: the reference path
        _s = [_kernelevolve_state(self, *path) for path in [('tables', '0', 'weight'), ('tables', '1', 'weight'), ('tables', '2', 'weight')]]
        v_getitem, v_getitem_4, v_getitem_8, = k0_segment(_s[0], args[0], args[1], _s[1], args[2], args[3], _s[2], args[4], args[5])
        v_cat = torch.ops.aten.cat.default([v_getitem, v_getitem_4, v_getitem_8], 1)
        v_view = torch.ops.aten.view.default(v_cat, [8, 3, 24])
        return v_view


def _kernelevolve_state(module, *path):
    *owners, leaf = path  # a parameter or buffer by its state_dict name, looked up afresh on every call
    for part in owners:
        module = module._modules[part]
    found = module._parameters.get(leaf)
    return module._buffers[leaf] if found is None else found


def _kernelevolve_shapes_match(args):
    return (tuple(args[0].shape) == (30,) and args[0].dtype == torch.int64
            and tuple(args[1].shape) == (8,) and args[1].dtype == torch.int64
            and tuple(args[2].shape) == (30,) and args[2].dtype == torch.int64
            and tuple(args[3].shape) == (8,) and args[3].dtype == torch.int64
            and tuple(args[4].shape) == (30,) and args[4].dtype == torch.int64
            and tuple(args[5].shape) == (8,) and args[5].dtype == torch.int64)
