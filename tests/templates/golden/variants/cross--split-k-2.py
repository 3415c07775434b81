"""Candidate from kernelevolve's template proposer (variant): dcn_cross."""


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
def k0_cross_s0_kernel(a_ptr, b0_ptr, s0_e0_ptr, s0_e1_ptr, s0_o0_ptr, M, N, K, s_ab, s_am, s_ak, s_b0b, s_b0k, s_b0n, s0_e0_sn, s0_e1_sm, s0_e1_sn,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr):
    pid = tl.program_id(0)
    rb64 = tl.program_id(1).to(tl.int64)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n
    first_m = (pid // width) * GROUP_M
    size_m = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.program_id(2) * BLOCK_K + tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rb64 * s_ab + (rm % M)[:, None] * s_am + rk[None, :] * s_ak
    b0_ptrs = b0_ptr + rb64 * s_b0b + rk[:, None] * s_b0k + (rn % N)[None, :] * s_b0n
    s0_acc0 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K * SPLIT_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b0 = tl.load(b0_ptrs)
        else:
            k_left = K - k * (BLOCK_K * SPLIT_K)
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b0 = tl.load(b0_ptrs, mask=rk[:, None] < k_left, other=0.0)
        s0_acc0 = tl.dot(a, b0, s0_acc0, input_precision="ieee")
        a_ptrs += (BLOCK_K * SPLIT_K) * s_ak
        b0_ptrs += (BLOCK_K * SPLIT_K) * s_b0k
    mask_m = rm < M
    mask_n = rn < N
    mask = mask_m[:, None] & mask_n[None, :]
    rm64 = rm.to(tl.int64)
    s0_e0 = tl.load(s0_e0_ptr + rn * s0_e0_sn, mask=mask_n, other=0)[None, :].to(tl.float32)
    s0_e1 = tl.load(s0_e1_ptr + rm64[:, None] * s0_e1_sm + rn[None, :] * s0_e1_sn, mask=mask, other=0).to(tl.float32)
    s0_h0 = s0_acc0 + s0_e0
    s0_v0_0 = (s0_e1 * s0_h0)
    s0_v1_0 = (s0_v0_0 + s0_e1)
    out_off = rb64 * M * N + rm64[:, None] * N + rn[None, :]
    tl.store(s0_o0_ptr + out_off, s0_v1_0.to(s0_o0_ptr.dtype.element_ty), mask=mask)


k0_cross_UPCAST = type(k0_cross_s0_kernel).__name__ == "InterpretedFunction"


def k0_cross_s0_prep(Bt, M, N, device, x_arg0_1, x_arg0_2, x_arg1_1):
    e = (x_arg0_2.expand(M, N).reshape(Bt, M, N), x_arg1_1.expand(M, N).reshape(Bt, M, N), )
    o = (torch.empty((Bt, M, N), device=device, dtype=torch.float32), )
    return e, o, (o[0].view(M, N), )


def k0_cross_s0(x_arg0_1, x_arg0_2, x_arg1_1):
    a = (x_arg1_1).unsqueeze(0)
    b0 = (x_arg0_1.permute(1, 0)).unsqueeze(0)
    Bt, M, K = a.shape
    N = b0.shape[2]
    if tuple(b0.shape) != (Bt, K, N):
        raise ValueError(f'k0_cross: cannot multiply {tuple(a.shape)} by {tuple(b0.shape)}')
    e, o, views = k0_cross_s0_prep(Bt, M, N, a.device, x_arg0_1, x_arg0_2, x_arg1_1)
    k0_cross_s0_kernel[(_cdiv(M, 32) * _cdiv(N, 32), Bt, 1)](a, b0, *e, *o, M, N, K, *a.stride(), *b0.stride(), e[0].stride(2), e[1].stride(1), e[1].stride(2), BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=8, SPLIT_K=1, EVEN_K=K % 32 == 0, UPCAST=k0_cross_UPCAST, num_warps=4, num_stages=3)
    return views


def k0_cross(*inputs):
    x_arg0_1, x_arg0_2, x_arg1_1, = inputs
    x_add, = k0_cross_s0(x_arg0_1, x_arg0_2, x_arg1_1)
    return (x_add, )


# ---- the reference, verbatim from the problem file ------------------------------------------------------------


import torch, torch.nn as nn, torch.nn.functional as F

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 32)
    def forward(self, x0):
        return x0 * self.fc(x0) + x0
def get_inputs(): return [torch.randn(23, 32)]
def get_init_inputs(): return []


# ---- end of reference -----------------------------------------------------------------------------------------


class ModelNew(Model):
    """Candidate from kernelevolve's template proposer (variant): dcn_cross."""

    def forward(self, *args):
        if len(args) != 1 or not _kernelevolve_shapes_match(args):
            return super().forward(*args)  # shapes the kernels were not generated for: the reference path
        _s = [_kernelevolve_state(self, *path) for path in [('fc', 'weight'), ('fc', 'bias')]]
        v_add, = k0_cross(_s[0], _s[1], args[0])
        return v_add


def _kernelevolve_state(module, *path):
    *owners, leaf = path  # a parameter or buffer by its state_dict name, looked up afresh on every call
    for part in owners:
        module = module._modules[part]
    found = module._parameters.get(leaf)
    return module._buffers[leaf] if found is None else found


def _kernelevolve_shapes_match(args):
    return (tuple(args[0].shape) == (23, 32) and args[0].dtype == torch.float32)
