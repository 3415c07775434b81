"""Candidate from kernelevolve's template proposer (variant): dual_gemm."""


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
def k0_dual_gemm_s0_kernel(a_ptr, b0_ptr, b1_ptr, s0_o0_ptr, M, N, K, s_ab, s_am, s_ak, s_b0b, s_b0k, s_b0n, s_b1b, s_b1k, s_b1n,
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
    b1_ptrs = b1_ptr + rb64 * s_b1b + rk[:, None] * s_b1k + (rn % N)[None, :] * s_b1n
    s0_acc0 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    s0_acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K * SPLIT_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b0 = tl.load(b0_ptrs)
            b1 = tl.load(b1_ptrs)
        else:
            k_left = K - k * (BLOCK_K * SPLIT_K)
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b0 = tl.load(b0_ptrs, mask=rk[:, None] < k_left, other=0.0)
            b1 = tl.load(b1_ptrs, mask=rk[:, None] < k_left, other=0.0)
        s0_acc0 = tl.dot(a, b0, s0_acc0, input_precision="ieee")
        s0_acc1 = tl.dot(a, b1, s0_acc1, input_precision="ieee")
        a_ptrs += (BLOCK_K * SPLIT_K) * s_ak
        b0_ptrs += (BLOCK_K * SPLIT_K) * s_b0k
        b1_ptrs += (BLOCK_K * SPLIT_K) * s_b1k
    mask_m = rm < M
    mask_n = rn < N
    mask = mask_m[:, None] & mask_n[None, :]
    rm64 = rm.to(tl.int64)
    s0_v0_0 = tl.sigmoid(s0_acc0)
    s0_v1_0 = (s0_acc0 * s0_v0_0)
    s0_v2_0 = (s0_v1_0 * s0_acc1)
    out_off = rb64 * M * N + rm64[:, None] * N + rn[None, :]
    tl.store(s0_o0_ptr + out_off, s0_v2_0.to(s0_o0_ptr.dtype.element_ty), mask=mask)


k0_dual_gemm_UPCAST = type(k0_dual_gemm_s0_kernel).__name__ == "InterpretedFunction"


@triton.jit
def k0_dual_gemm_s0_sk(a_ptr, b0_ptr, b1_ptr, ws_ptr, Bt, M, N, K, ITERS, PIECES, s_ab, s_am, s_ak, s_b0b, s_b0k, s_b0n, s_b1b, s_b1k, s_b1n,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
        UPCAST: tl.constexpr):
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    per_batch = grid_m * grid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    n_tiles = Bt * per_batch
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    rk = tl.arange(0, BLOCK_K)
    it = tl.program_id(0) * ITERS
    end = tl.minimum(it + ITERS, n_tiles * k_tiles)
    while it < end:
        tile = it // k_tiles
        k0 = it % k_tiles
        k1 = tl.minimum(k_tiles, k0 + (end - it))
        rb64 = (tile // per_batch).to(tl.int64)
        pid_m = (tile % per_batch) // grid_n
        pid_n = (tile % per_batch) % grid_n
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        a_ptrs = a_ptr + rb64 * s_ab + (rm % M)[:, None] * s_am + (k0 * BLOCK_K + rk)[None, :] * s_ak
        b0_ptrs = b0_ptr + rb64 * s_b0b + (k0 * BLOCK_K + rk)[:, None] * s_b0k + (rn % N)[None, :] * s_b0n
        b1_ptrs = b1_ptr + rb64 * s_b1b + (k0 * BLOCK_K + rk)[:, None] * s_b1k + (rn % N)[None, :] * s_b1n
        s0_acc0 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        s0_acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(k0, k1):
            if EVEN_K:
                a = tl.load(a_ptrs)
                b0 = tl.load(b0_ptrs)
                b1 = tl.load(b1_ptrs)
            else:
                k_left = K - k * BLOCK_K
                a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
                b0 = tl.load(b0_ptrs, mask=rk[:, None] < k_left, other=0.0)
                b1 = tl.load(b1_ptrs, mask=rk[:, None] < k_left, other=0.0)
            s0_acc0 = tl.dot(a, b0, s0_acc0, input_precision="ieee")
            s0_acc1 = tl.dot(a, b1, s0_acc1, input_precision="ieee")
            a_ptrs += BLOCK_K * s_ak
            b0_ptrs += BLOCK_K * s_b0k
            b1_ptrs += BLOCK_K * s_b1k
        piece = tl.program_id(0) - (tile * k_tiles) // ITERS
        tl.store(ws_ptr + ((0 * n_tiles + tile) * PIECES + piece).to(tl.int64) * (BLOCK_M * BLOCK_N) + offs, s0_acc0)
        tl.store(ws_ptr + ((1 * n_tiles + tile) * PIECES + piece).to(tl.int64) * (BLOCK_M * BLOCK_N) + offs, s0_acc1)
        it += k1 - k0


@triton.jit
def k0_dual_gemm_s0_fix(ws_ptr, s0_o0_ptr, Bt, M, N, K, ITERS, PIECES,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    per_batch = grid_m * grid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    n_tiles = Bt * per_batch
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tile = tl.program_id(0)
    rb64 = (tile // per_batch).to(tl.int64)
    pid_m = (tile % per_batch) // grid_n
    pid_n = (tile % per_batch) % grid_n
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = rm < M
    mask_n = rn < N
    mask = mask_m[:, None] & mask_n[None, :]
    first = (tile * k_tiles) // ITERS
    last = ((tile + 1) * k_tiles - 1) // ITERS
    s0_acc0 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    s0_acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for piece in range(0, last - first + 1):
        s0_acc0 += tl.load(ws_ptr + ((0 * n_tiles + tile) * PIECES + piece).to(tl.int64) * (BLOCK_M * BLOCK_N) + offs)
        s0_acc1 += tl.load(ws_ptr + ((1 * n_tiles + tile) * PIECES + piece).to(tl.int64) * (BLOCK_M * BLOCK_N) + offs)
    rm64 = rm.to(tl.int64)
    s0_v0_0 = tl.sigmoid(s0_acc0)
    s0_v1_0 = (s0_acc0 * s0_v0_0)
    s0_v2_0 = (s0_v1_0 * s0_acc1)
    out_off = rb64 * M * N + rm64[:, None] * N + rn[None, :]
    tl.store(s0_o0_ptr + out_off, s0_v2_0.to(s0_o0_ptr.dtype.element_ty), mask=mask)


k0_dual_gemm_s0_SMS = {}


def k0_dual_gemm_s0_sms(device):
    if device not in k0_dual_gemm_s0_SMS:
        k0_dual_gemm_s0_SMS[device] = (torch.cuda.get_device_properties(device).multi_processor_count
                                       if device.type == "cuda" else 4)
    return k0_dual_gemm_s0_SMS[device]


def k0_dual_gemm_s0_prep(Bt, M, N, device, x_arg0_1, x_arg1_1, x_arg0_2):
    e = ()
    o = (torch.empty((Bt, M, N), device=device, dtype=torch.float32), )
    return e, o, (o[0].view(M, N), )


def k0_dual_gemm_s0(x_arg0_1, x_arg1_1, x_arg0_2):
    a = (x_arg1_1).unsqueeze(0)
    b0 = (x_arg0_1.permute(1, 0)).unsqueeze(0)
    b1 = (x_arg0_2.permute(1, 0)).unsqueeze(0)
    Bt, M, K = a.shape
    N = b0.shape[2]
    if tuple(b0.shape) != (Bt, K, N):
        raise ValueError(f'k0_dual_gemm: cannot multiply {tuple(a.shape)} by {tuple(b0.shape)}')
    if tuple(b1.shape) != (Bt, K, N):
        raise ValueError(f'k0_dual_gemm: cannot multiply {tuple(a.shape)} by {tuple(b1.shape)}')
    e, o, views = k0_dual_gemm_s0_prep(Bt, M, N, a.device, x_arg0_1, x_arg1_1, x_arg0_2)
    tiles = Bt * _cdiv(M, 32) * _cdiv(N, 32)
    k_tiles = _cdiv(K, 32)
    progs = max(1, min(k0_dual_gemm_s0_sms(a.device), tiles * k_tiles))
    iters = min(64, _cdiv(tiles * k_tiles, progs))
    pieces = _cdiv(k_tiles, iters) + 1
    ws = torch.empty((2, tiles, pieces, 32, 32), device=a.device, dtype=torch.float32)
    k0_dual_gemm_s0_sk[(_cdiv(tiles * k_tiles, iters),)](a, b0, b1, ws, Bt, M, N, K, iters, pieces, *a.stride(), *b0.stride(), *b1.stride(), BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, EVEN_K=K % 32 == 0, UPCAST=k0_dual_gemm_UPCAST, num_warps=4, num_stages=3)
    k0_dual_gemm_s0_fix[(tiles,)](ws, *e, *o, Bt, M, N, K, iters, pieces, BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, num_warps=4)
    return views


def k0_dual_gemm(*inputs):
    x_arg0_1, x_arg1_1, x_arg0_2, = inputs
    x_mul_1, = k0_dual_gemm_s0(x_arg0_1, x_arg1_1, x_arg0_2)
    return (x_mul_1, )


# ---- the reference, verbatim from the problem file ------------------------------------------------------------


import torch, torch.nn as nn, torch.nn.functional as F

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(32, 48, bias=False)
        self.w3 = nn.Linear(32, 48, bias=False)
    def forward(self, x):
        return F.silu(self.w1(x)) * self.w3(x)
def get_inputs(): return [torch.randn(19, 32)]
def get_init_inputs(): return []


# ---- end of reference -----------------------------------------------------------------------------------------


class ModelNew(Model):
    """Candidate from kernelevolve's template proposer (variant): dual_gemm."""

    def forward(self, *args):
        if len(args) != 1 or not _kernelevolve_shapes_match(args):
            return super().forward(*args)  # shapes the kernels were not generated for: the reference path
        _s = [_kernelevolve_state(self, *path) for path in [('w1', 'weight'), ('w3', 'weight')]]
        v_mul_1, = k0_dual_gemm(_s[0], args[0], _s[1])
        return v_mul_1


def _kernelevolve_state(module, *path):
    *owners, leaf = path  # a parameter or buffer by its state_dict name, looked up afresh on every call
    for part in owners:
        module = module._modules[part]
    found = module._parameters.get(leaf)
    return module._buffers[leaf] if found is None else found


def _kernelevolve_shapes_match(args):
    return (tuple(args[0].shape) == (19, 32) and args[0].dtype == torch.float32)
