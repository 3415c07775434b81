"""Candidate from kernelevolve's template proposer (variant): matmul_reduction."""


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
def k0_matmul_reduction_kernel(a_ptr, b0_ptr, s0_e0_ptr, out0_ptr, M, N, K, s_am, s_ak, s_b0k, s_b0n, s0_e0_sn,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,
        BLOCK_C: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (rm % M)[:, None] * s_am + rk[None, :] * s_ak
    b0_ptrs = b0_ptr + rk[:, None] * s_b0k + (rn % N)[None, :] * s_b0n
    s0_acc0 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b0 = tl.load(b0_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b0 = tl.load(b0_ptrs, mask=rk[:, None] < k_left, other=0.0)
        s0_acc0 = tl.dot(a, b0, s0_acc0, input_precision="tf32x3")
        a_ptrs += BLOCK_K * s_ak
        b0_ptrs += BLOCK_K * s_b0k
    mask_m = rm < M
    mask_n = rn < N
    mask = mask_m[:, None] & mask_n[None, :]
    rm64 = rm.to(tl.int64)
    s0_e0 = tl.load(s0_e0_ptr + rn * s0_e0_sn, mask=mask_n, other=0)[None, :].to(tl.float32)
    s0_h0 = s0_acc0 + s0_e0
    rows = rm64[:, None]
    rmask = rows < M
    cols = rn[None, :]
    cmask = cols < N
    v_amax = tl.max(tl.where(mask, s0_h0, float('-inf')), axis=1)[:, None]
    v_sub = (s0_h0 - v_amax)
    v_exp = tl.exp(v_sub)
    v_sum_1 = tl.sum(tl.where(mask, v_exp, 0.0), axis=1)[:, None]
    v_div = (v_exp / v_sum_1)
    tl.store(out0_ptr + (rows * 33) + cols, (v_div + tl.zeros([BLOCK_R, BLOCK_C], tl.float32)).to(tl.float32), mask=mask)


k0_matmul_reduction_UPCAST = type(k0_matmul_reduction_kernel).__name__ == "InterpretedFunction"


def k0_matmul_reduction_s0_prep(Bt, M, N, device, x_arg0_1, x_arg0_2, x_arg1_1):
    e = (x_arg0_2.expand(M, N).reshape(Bt, M, N), )
    o = ()
    return e, o, ()


def k0_matmul_reduction(*inputs):
    x_arg0_1, x_arg0_2, x_arg1_1, = inputs
    a = x_arg1_1
    b0 = x_arg0_1.permute(1, 0)
    M, K = a.shape
    N = b0.shape[1]
    if tuple(b0.shape) != (K, N):
        raise ValueError(f'k0_matmul_reduction: cannot multiply {tuple(a.shape)} by {tuple(b0.shape)}')
    e, _, _ = k0_matmul_reduction_s0_prep(1, M, N, a.device, x_arg0_1, x_arg0_2, x_arg1_1)
    outs = (torch.empty([1030, 33], dtype=torch.float32, device=a.device),)
    k0_matmul_reduction_kernel[(_cdiv(M, 16),)](a, b0, *e, *outs, M, N, K, *a.stride(), *b0.stride(), e[0].stride(2), 
        BLOCK_M=16, BLOCK_N=64, BLOCK_K=32, BLOCK_R=16, BLOCK_C=64, EVEN_K=K % 32 == 0,
        UPCAST=k0_matmul_reduction_UPCAST, num_warps=8, num_stages=3)
    return outs


# ---- the reference, verbatim from the problem file ------------------------------------------------------------


import torch, torch.nn as nn, torch.nn.functional as F

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(40, 33)
    def forward(self, x):
        return torch.softmax(self.gate(x), dim=-1)
def get_inputs(): return [torch.randn(1030, 40)]
def get_init_inputs(): return []


# ---- end of reference -----------------------------------------------------------------------------------------


class ModelNew(Model):
    """Candidate from kernelevolve's template proposer (variant): matmul_reduction."""

    def forward(self, *args):
        if len(args) != 1 or not _kernelevolve_shapes_match(args):
            return super().forward(*args)  # shapes the kernels were not generated for: the reference path
        _s = [_kernelevolve_state(self, *path) for path in [('gate', 'weight'), ('gate', 'bias')]]
        v_div, = k0_matmul_reduction(_s[0], _s[1], args[0])
        return v_div


def _kernelevolve_state(module, *path):
    *owners, leaf = path  # a parameter or buffer by its state_dict name, looked up afresh on every call
    for part in owners:
        module = module._modules[part]
    found = module._parameters.get(leaf)
    return module._buffers[leaf] if found is None else found


def _kernelevolve_shapes_match(args):
    return (tuple(args[0].shape) == (1030, 40) and args[0].dtype == torch.float32)
