"""Candidate from kernelevolve's template proposer (variant): pairwise_interaction."""


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


k0_interaction_FLAT = [16, 32, 33, 48, 49, 50, 64, 65, 66, 67, 80, 81, 82, 83, 84]

@triton.jit
def k0_interaction_kernel(f0_ptr, f0_sb, f0_sf, f1_ptr, f1_sb, f1_sf, pos_ptr, c0_ptr, c0_s0, c0_s1, out_ptr, B, D, stride_o,
        BLOCK_B: tl.constexpr, F: tl.constexpr, F_PAD: tl.constexpr, BLOCK_K: tl.constexpr, P: tl.constexpr,
        P_PAD: tl.constexpr):
    fi = tl.arange(0, F_PAD)
    p = tl.arange(0, P_PAD)
    pmask = p < P
    flat = tl.load(pos_ptr + p, mask=pmask, other=0)
    for r in tl.static_range(BLOCK_B):
        # rows past the end redo the last row: the same values to the same place, no batch mask needed
        b = tl.minimum(tl.program_id(0) * BLOCK_B + r, B - 1).to(tl.int64)
        rowp = f0_ptr + b * f0_sb + (fi - 0) * f0_sf
        rowp = tl.where(fi >= 1, f1_ptr + b * f1_sb + (fi - 1) * f1_sf, rowp)
        z = tl.zeros([F_PAD, F_PAD], tl.float32)
        for k0 in range(0, D, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            t = tl.load(rowp[:, None] + k[None, :], mask=(fi < F)[:, None] & (k < D)[None, :], other=0.0)
            z = tl.dot(t, tl.trans(t), z, input_precision="tf32x3")
        v = tl.gather(tl.reshape(z, [F_PAD * F_PAD]), flat, 0)
        tl.store(out_ptr + b * stride_o + 16 + p, v.to(tl.float32), mask=pmask)
        ck = tl.arange(0, 16)
        v = tl.load(c0_ptr + b * c0_s0 + ck * c0_s1, mask=ck < 16, other=0)
        tl.store(out_ptr + b * stride_o + 0 + ck, v.to(tl.float32), mask=ck < 16)

k0_interaction_cache = {}


def k0_interaction(*inputs):
    B = 7
    out = torch.empty((7, 31), dtype=torch.float32, device=inputs[0].device)
    f0 = inputs[0].reshape((7, 1, 16))
    f0 = f0 if f0.stride(-1) == 1 else f0.contiguous()
    assert f0.shape[0] == B, 'features of the traced batch expected'
    f1 = inputs[1]
    f1 = f1 if f1.stride(-1) == 1 else f1.contiguous()
    assert f1.shape[0] == B, 'features of the traced batch expected'
    pos = k0_interaction_cache.get(out.device)
    if pos is None:
        pos = k0_interaction_cache[out.device] = torch.tensor(k0_interaction_FLAT, dtype=torch.int32, device=out.device)
    grid = (_cdiv(B, 1),)
    k0_interaction_kernel[grid](f0, f0.stride(0), f0.stride(1), f1, f1.stride(0), f1.stride(1), pos, inputs[0], inputs[0].stride(0), inputs[0].stride(1), out, B, 16, out.stride(0),
        BLOCK_B=1, F=6, F_PAD=16, BLOCK_K=16, P=15, P_PAD=16,
        num_warps=4, num_stages=2)
    return (out,)


# ---- the reference, verbatim from the problem file ------------------------------------------------------------


import torch, torch.nn as nn, torch.nn.functional as F

class Model(nn.Module):
    def forward(self, dense, sparse):
        t = torch.cat([dense.unsqueeze(1), sparse], dim=1)
        z = torch.bmm(t, t.transpose(1, 2))
        i, j = torch.tril_indices(t.shape[1], t.shape[1], offset=-1)
        return torch.cat([dense, z[:, i, j]], dim=1)
def get_inputs(): return [torch.randn(7, 16), torch.randn(7, 5, 16)]
def get_init_inputs(): return []


# ---- end of reference -----------------------------------------------------------------------------------------


class ModelNew(Model):
    """Candidate from kernelevolve's template proposer (variant): pairwise_interaction."""

    def forward(self, *args):
        if len(args) != 2 or not _kernelevolve_shapes_match(args):
            return super().forward(*args)  # shapes the kernels were not generated for: the reference path
        v_cat_1, = k0_interaction(args[0], args[1])
        return v_cat_1


def _kernelevolve_state(module, *path):
    *owners, leaf = path  # a parameter or buffer by its state_dict name, looked up afresh on every call
    for part in owners:
        module = module._modules[part]
    found = module._parameters.get(leaf)
    return module._buffers[leaf] if found is None else found


def _kernelevolve_shapes_match(args):
    return (tuple(args[0].shape) == (7, 16) and args[0].dtype == torch.float32
            and tuple(args[1].shape) == (7, 5, 16) and args[1].dtype == torch.float32)
