"""Candidate from kernelevolve's template proposer (variant): batched_matmul."""


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
def k0_batched_matmul_kernel(a_ptr, b_ptr, c_ptr, s0_e0_ptr, s1_o0_ptr, M, K, H, N, s_ab, s_am, s_ak, s_bb, s_bk, s_bn, s_cb, s_ck, s_cn, s0_e0_sb, s0_e0_sn,
        BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
        EVEN_K: tl.constexpr, UPCAST: tl.constexpr):
    pid_m = tl.program_id(0)
    rb64 = tl.program_id(1).to(tl.int64)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rh = tl.arange(0, BLOCK_H)
    rk = tl.arange(0, BLOCK_K)
    mask_m = rm < M
    mask_h = rh < H
    mask0 = mask_m[:, None] & mask_h[None, :]
    a_ptrs = a_ptr + rb64 * s_ab + (rm % M)[:, None] * s_am + rk[None, :] * s_ak
    b_ptrs = b_ptr + rb64 * s_bb + rk[:, None] * s_bk + rh[None, :] * s_bn
    s0_acc0 = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs, mask=mask_h[None, :], other=0.0)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=(rk[:, None] < k_left) & mask_h[None, :], other=0.0)
        s0_acc0 = tl.dot(a, b, s0_acc0, input_precision="ieee")
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk
    rm64 = rm.to(tl.int64)
    s0_e0 = tl.load(s0_e0_ptr + rb64 * s0_e0_sb + rh * s0_e0_sn, mask=mask_h, other=0)[None, :].to(tl.float32)
    s0_v0_0 = (s0_e0 + s0_acc0)
    s0_v1_0 = tl.maximum(s0_v0_0, 0.0)
    hv = tl.where(mask_h[None, :], s0_v1_0, 0.0).to(tl.float32)
    c_ptrs = c_ptr + rb64 * s_cb + rh[:, None] * s_ck
    for n0 in range(0, N, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        mask_n = rn < N
        mask = mask_m[:, None] & mask_n[None, :]
        c = tl.load(c_ptrs + rn[None, :] * s_cn, mask=mask_h[:, None] & mask_n[None, :], other=0.0)
        s1_acc0 = tl.dot(hv, c, input_precision="ieee")
        rm64 = rm.to(tl.int64)
        out_off = rb64 * M * N + rm64[:, None] * N + rn[None, :]
        tl.store(s1_o0_ptr + out_off, s1_acc0.to(s1_o0_ptr.dtype.element_ty), mask=mask)


k0_batched_matmul_UPCAST = type(k0_batched_matmul_kernel).__name__ == "InterpretedFunction"


def k0_batched_matmul_s0_prep(Bt, M, N, device, x_arg1_1, x_arg0_1, x_arg0_2, x_arg0_3):
    e = (x_arg0_2.expand(Bt, M, N).reshape(Bt, M, N), )
    o = ()
    return e, o, ()


def k0_batched_matmul_s1_prep(Bt, M, N, device, x_arg1_1, x_arg0_1, x_arg0_2, x_arg0_3):
    e = ()
    o = (torch.empty((Bt, M, N), device=device, dtype=torch.float32), )
    return e, o, (o[0].view(Bt, M, N), )


def k0_batched_matmul(*inputs):
    x_arg1_1, x_arg0_1, x_arg0_2, x_arg0_3, = inputs
    a = x_arg1_1
    b = x_arg0_1
    c = x_arg0_3
    Bt, M, K = a.shape
    H, N = b.shape[2], c.shape[2]
    if tuple(b.shape) != (Bt, K, H) or tuple(c.shape) != (Bt, H, N):
        raise ValueError(f'k0_batched_matmul: cannot chain {tuple(a.shape)}, {tuple(b.shape)}, {tuple(c.shape)}')
    e0, _, _ = k0_batched_matmul_s0_prep(Bt, M, H, a.device, x_arg1_1, x_arg0_1, x_arg0_2, x_arg0_3)
    e1, o, views = k0_batched_matmul_s1_prep(Bt, M, N, a.device, x_arg1_1, x_arg0_1, x_arg0_2, x_arg0_3)
    k0_batched_matmul_kernel[(_cdiv(M, 32), Bt)](a, b, c, *e0, *e1, *o, M, K, H, N, *a.stride(), *b.stride(), *c.stride(), e0[0].stride(0), e0[0].stride(2),
        BLOCK_M=32, BLOCK_K=32, BLOCK_H=max(16, 1 << (H - 1).bit_length()), BLOCK_N=16,
        EVEN_K=K % 32 == 0, UPCAST=k0_batched_matmul_UPCAST, num_warps=4, num_stages=3)
    return (views[0], )


# ---- the reference, verbatim from the problem file ------------------------------------------------------------


import torch, torch.nn as nn, torch.nn.functional as F

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(3, 32, 32) * 0.1)
        self.b1 = nn.Parameter(torch.randn(3, 1, 32))
        self.w2 = nn.Parameter(torch.randn(3, 32, 16) * 0.1)
    def forward(self, x):
        return torch.bmm(torch.relu(torch.baddbmm(self.b1, x, self.w1)), self.w2)
def get_inputs(): return [torch.randn(3, 21, 32)]
def get_init_inputs(): return []


# ---- end of reference -----------------------------------------------------------------------------------------


class ModelNew(Model):
    """Candidate from kernelevolve's template proposer (variant): batched_matmul."""

    def forward(self, *args):
        if len(args) != 1 or not _kernelevolve_shapes_match(args):
            return super().forward(*args)  # shapes the kernels were not generated for: the reference path
        _s = [_kernelevolve_state(self, *path) for path in [('w1',), ('b1',), ('w2',)]]
        v_bmm_1, = k0_batched_matmul(args[0], _s[0], _s[1], _s[2])
        return v_bmm_1


def _kernelevolve_state(module, *path):
    *owners, leaf = path  # a parameter or buffer by its state_dict name, looked up afresh on every call
    for part in owners:
        module = module._modules[part]
    found = module._parameters.get(leaf)
    return module._buffers[leaf] if found is None else found


def _kernelevolve_shapes_match(args):
    return (tuple(args[0].shape) == (3, 21, 32) and args[0].dtype == torch.float32)
