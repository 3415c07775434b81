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
def k0_batched_matmul_s0_kernel(a_ptr, b0_ptr, a_lo_ptr, b0_lo_ptr, s0_e0_ptr, s0_o0_ptr, M, N, K, s_ab, s_am, s_ak, s_b0b, s_b0k, s_b0n, s0_e0_sb, s0_e0_sn,
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
    a_lo_ptrs = a_lo_ptr + rb64 * s_ab + (rm % M)[:, None] * s_am + rk[None, :] * s_ak
    b0_lo_ptrs = b0_lo_ptr + rb64 * s_b0b + rk[:, None] * s_b0k + (rn % N)[None, :] * s_b0n
    s0_acc0 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K * SPLIT_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b0 = tl.load(b0_ptrs)
            a_lo = tl.load(a_lo_ptrs)
            b0_lo = tl.load(b0_lo_ptrs)
        else:
            k_left = K - k * (BLOCK_K * SPLIT_K)
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b0 = tl.load(b0_ptrs, mask=rk[:, None] < k_left, other=0.0)
            a_lo = tl.load(a_lo_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b0_lo = tl.load(b0_lo_ptrs, mask=rk[:, None] < k_left, other=0.0)
        s0_acc0 = tl.dot(a_lo, b0, s0_acc0, input_precision="tf32")
        s0_acc0 = tl.dot(a, b0_lo, s0_acc0, input_precision="tf32")
        s0_acc0 = tl.dot(a, b0, s0_acc0, input_precision="tf32")
        a_ptrs += (BLOCK_K * SPLIT_K) * s_ak
        b0_ptrs += (BLOCK_K * SPLIT_K) * s_b0k
        a_lo_ptrs += (BLOCK_K * SPLIT_K) * s_ak
        b0_lo_ptrs += (BLOCK_K * SPLIT_K) * s_b0k
    mask_m = rm < M
    mask_n = rn < N
    mask = mask_m[:, None] & mask_n[None, :]
    rm64 = rm.to(tl.int64)
    s0_e0 = tl.load(s0_e0_ptr + rb64 * s0_e0_sb + rn * s0_e0_sn, mask=mask_n, other=0)[None, :].to(tl.float32)
    s0_v0_0 = (s0_e0 + s0_acc0)
    s0_v1_0 = tl.maximum(s0_v0_0, 0.0)
    out_off = rb64 * M * N + rm64[:, None] * N + rn[None, :]
    tl.store(s0_o0_ptr + out_off, s0_v1_0.to(s0_o0_ptr.dtype.element_ty), mask=mask)


k0_batched_matmul_UPCAST = type(k0_batched_matmul_s0_kernel).__name__ == "InterpretedFunction"


@triton.jit
def k0_batched_matmul_s0_split_kernel(x_ptr, hi_ptr, lo_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    bits = x.to(tl.int32, bitcast=True)
    # the nearest value with TF32's 10 mantissa bits (rounding the magnitude's bits), truncated instead where
    # rounding would pass the largest finite float; then what is left (none where hi is x: infinities too)
    hi = ((bits + 0x1000) & -0x2000).to(tl.float32, bitcast=True)
    hi = tl.where(tl.abs(hi) > 3.4e38, (bits & -0x2000).to(tl.float32, bitcast=True), hi)
    tl.store(hi_ptr + offs, hi, mask=mask)
    tl.store(lo_ptr + offs, tl.where(hi == x, 0.0, x - hi), mask=mask)


def k0_batched_matmul_s0_split(x):
    if any(s == 0 and n > 1 for s, n in zip(x.stride(), x.shape)):
        one = x[tuple(slice(0, 1) if s == 0 else slice(None) for s in x.stride())]
        hi, lo = k0_batched_matmul_s0_split(one)
        return hi.expand(x.shape), lo.expand(x.shape)
    hi = torch.empty_like(x)
    if hi.stride() != x.stride():  # not dense: split a row-major copy into row-major parts
        x = x.contiguous()
        hi = torch.empty_like(x)
    lo = torch.empty_like(hi)
    n = x.numel()
    k0_batched_matmul_s0_split_kernel[(_cdiv(n, 4096),)](x, hi, lo, n, BLOCK=4096, num_warps=8)
    return hi, lo


def k0_batched_matmul_s0_prep(Bt, M, N, device, x_arg1_1, x_arg0_1, x_arg0_2, x_arg0_3):
    e = (x_arg0_2.expand(Bt, M, N).reshape(Bt, M, N), )
    o = (torch.empty((Bt, M, N), device=device, dtype=torch.float32), )
    return e, o, (o[0].view(Bt, M, N), )


def k0_batched_matmul_s0(x_arg1_1, x_arg0_1, x_arg0_2, x_arg0_3):
    a = (x_arg1_1)
    b0 = (x_arg0_1)
    Bt, M, K = a.shape
    N = b0.shape[2]
    if tuple(b0.shape) != (Bt, K, N):
        raise ValueError(f'k0_batched_matmul: cannot multiply {tuple(a.shape)} by {tuple(b0.shape)}')
    e, o, views = k0_batched_matmul_s0_prep(Bt, M, N, a.device, x_arg1_1, x_arg0_1, x_arg0_2, x_arg0_3)
    a, a_lo = k0_batched_matmul_s0_split(a)
    b0, b0_lo = k0_batched_matmul_s0_split(b0)
    k0_batched_matmul_s0_kernel[(_cdiv(M, 32) * _cdiv(N, 32), Bt, 1)](a, b0, a_lo, b0_lo, *e, *o, M, N, K, *a.stride(), *b0.stride(), e[0].stride(0), e[0].stride(2), BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=8, SPLIT_K=1, EVEN_K=K % 32 == 0, UPCAST=k0_batched_matmul_UPCAST, num_warps=4, num_stages=3)
    return views


@triton.jit
def k0_batched_matmul_s1_kernel(a_ptr, b0_ptr, a_lo_ptr, b0_lo_ptr, s1_o0_ptr, M, N, K, s_ab, s_am, s_ak, s_b0b, s_b0k, s_b0n,
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
    a_lo_ptrs = a_lo_ptr + rb64 * s_ab + (rm % M)[:, None] * s_am + rk[None, :] * s_ak
    b0_lo_ptrs = b0_lo_ptr + rb64 * s_b0b + rk[:, None] * s_b0k + (rn % N)[None, :] * s_b0n
    s1_acc0 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K * SPLIT_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b0 = tl.load(b0_ptrs)
            a_lo = tl.load(a_lo_ptrs)
            b0_lo = tl.load(b0_lo_ptrs)
        else:
            k_left = K - k * (BLOCK_K * SPLIT_K)
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b0 = tl.load(b0_ptrs, mask=rk[:, None] < k_left, other=0.0)
            a_lo = tl.load(a_lo_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b0_lo = tl.load(b0_lo_ptrs, mask=rk[:, None] < k_left, other=0.0)
        s1_acc0 = tl.dot(a_lo, b0, s1_acc0, input_precision="tf32")
        s1_acc0 = tl.dot(a, b0_lo, s1_acc0, input_precision="tf32")
        s1_acc0 = tl.dot(a, b0, s1_acc0, input_precision="tf32")
        a_ptrs += (BLOCK_K * SPLIT_K) * s_ak
        b0_ptrs += (BLOCK_K * SPLIT_K) * s_b0k
        a_lo_ptrs += (BLOCK_K * SPLIT_K) * s_ak
        b0_lo_ptrs += (BLOCK_K * SPLIT_K) * s_b0k
    mask_m = rm < M
    mask_n = rn < N
    mask = mask_m[:, None] & mask_n[None, :]
    rm64 = rm.to(tl.int64)
    out_off = rb64 * M * N + rm64[:, None] * N + rn[None, :]
    tl.store(s1_o0_ptr + out_off, s1_acc0.to(s1_o0_ptr.dtype.element_ty), mask=mask)


@triton.jit
def k0_batched_matmul_s1_split_kernel(x_ptr, hi_ptr, lo_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    bits = x.to(tl.int32, bitcast=True)
    # the nearest value with TF32's 10 mantissa bits (rounding the magnitude's bits), truncated instead where
    # rounding would pass the largest finite float; then what is left (none where hi is x: infinities too)
    hi = ((bits + 0x1000) & -0x2000).to(tl.float32, bitcast=True)
    hi = tl.where(tl.abs(hi) > 3.4e38, (bits & -0x2000).to(tl.float32, bitcast=True), hi)
    tl.store(hi_ptr + offs, hi, mask=mask)
    tl.store(lo_ptr + offs, tl.where(hi == x, 0.0, x - hi), mask=mask)


def k0_batched_matmul_s1_split(x):
    if any(s == 0 and n > 1 for s, n in zip(x.stride(), x.shape)):
        one = x[tuple(slice(0, 1) if s == 0 else slice(None) for s in x.stride())]
        hi, lo = k0_batched_matmul_s1_split(one)
        return hi.expand(x.shape), lo.expand(x.shape)
    hi = torch.empty_like(x)
    if hi.stride() != x.stride():  # not dense: split a row-major copy into row-major parts
        x = x.contiguous()
        hi = torch.empty_like(x)
    lo = torch.empty_like(hi)
    n = x.numel()
    k0_batched_matmul_s1_split_kernel[(_cdiv(n, 4096),)](x, hi, lo, n, BLOCK=4096, num_warps=8)
    return hi, lo


def k0_batched_matmul_s1_prep(Bt, M, N, device, x_arg1_1, x_arg0_1, x_arg0_2, x_arg0_3, x_relu):
    e = ()
    o = (torch.empty((Bt, M, N), device=device, dtype=torch.float32), )
    return e, o, (o[0].view(Bt, M, N), )


def k0_batched_matmul_s1(x_arg1_1, x_arg0_1, x_arg0_2, x_arg0_3, x_relu):
    a = (x_relu)
    b0 = (x_arg0_3)
    Bt, M, K = a.shape
    N = b0.shape[2]
    if tuple(b0.shape) != (Bt, K, N):
        raise ValueError(f'k0_batched_matmul: cannot multiply {tuple(a.shape)} by {tuple(b0.shape)}')
    e, o, views = k0_batched_matmul_s1_prep(Bt, M, N, a.device, x_arg1_1, x_arg0_1, x_arg0_2, x_arg0_3, x_relu)
    a, a_lo = k0_batched_matmul_s1_split(a)
    b0, b0_lo = k0_batched_matmul_s1_split(b0)
    k0_batched_matmul_s1_kernel[(_cdiv(M, 32) * _cdiv(N, 16), Bt, 1)](a, b0, a_lo, b0_lo, *e, *o, M, N, K, *a.stride(), *b0.stride(), BLOCK_M=32, BLOCK_N=16, BLOCK_K=32, GROUP_M=8, SPLIT_K=1, EVEN_K=K % 32 == 0, UPCAST=k0_batched_matmul_UPCAST, num_warps=4, num_stages=3)
    return views


def k0_batched_matmul(*inputs):
    x_arg1_1, x_arg0_1, x_arg0_2, x_arg0_3, = inputs
    x_relu, = k0_batched_matmul_s0(x_arg1_1, x_arg0_1, x_arg0_2, x_arg0_3)
    x_bmm_1, = k0_batched_matmul_s1(x_arg1_1, x_arg0_1, x_arg0_2, x_arg0_3, x_relu)
    return (x_bmm_1, )


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
