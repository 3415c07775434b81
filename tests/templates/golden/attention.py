"""Candidate from kernelevolve's template proposer (defaults): attention."""


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


k0_attention_LAYOUTS = {}  # (shape, strides, z, m, k) -> layout, or None where the operand needs a copy


def k0_attention_layout(x, z, m, k):
    """(n1, n2, s0, s1, s2, sm, sk): ``x`` read as [z, m, k], z split over three strided dims; None if it cannot."""
    dims = [(s, st) for s, st in zip(x.shape, x.stride()) if s != 1]
    inner = []
    for want in (k, m):
        group, size = [], 1
        while size < want and dims:
            group.insert(0, dims.pop())
            size *= group[0][0]
        if size != want or any(a[1] != b[1] * b[0] for a, b in zip(group, group[1:])):
            return None
        inner.append(group[-1][1] if group else 0)
    batch, total = [], 1
    for s, st in dims:
        total *= s
        if batch and batch[-1][1] == st * s:
            batch[-1] = (batch[-1][0] * s, st)
        else:
            batch.append((s, st))
    if total != z or len(batch) > 3:
        return None
    batch = [(1, 0)] * (3 - len(batch)) + batch
    return batch[1][0], batch[2][0], batch[0][1], batch[1][1], batch[2][1], inner[1], inner[0]


def k0_attention_operand(x, z, m, k):
    key = (x.shape, x.stride(), z, m, k)  # worked out once per shape and strides, not on every call
    lay = k0_attention_LAYOUTS.get(key, False)
    if lay is False:
        if x.numel() != z * m * k:
            raise ValueError(f"expected {z}x{m}x{k} elements, got shape {tuple(x.shape)}")
        lay = k0_attention_LAYOUTS[key] = k0_attention_layout(x, z, m, k)
    if lay is None:  # batch dims that three strides cannot express: one copy, as the reference's reshape makes
        return k0_attention_operand(x.reshape(z, m, k), z, m, k)
    return x, lay



@triton.jit
def k0_attention_zoff(z, n1, n2, s0, s1, s2):
    return (z // (n1 * n2)) * s0 + ((z // n2) % n1) * s1 + (z % n2) * s2


@triton.jit
def k0_attention_kernel(
    Q, K, V, O, M, N, D, DV,
    q_n1, q_n2, q_s0, q_s1, q_s2, q_sa, q_sb,
    k_n1, k_n2, k_s0, k_s1, k_s2, k_sa, k_sb,
    v_n1, v_n2, v_s0, v_s1, v_s2, v_sa, v_sb,
    o_n1, o_n2, o_s0, o_s1, o_s2, o_sa, o_sb,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    EVEN_M: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, UPCAST: tl.constexpr,
):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    z = (pid // num_m).to(tl.int64)
    m0 = (num_m - 1 - pid % num_m) * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_DV)
    m_ok = offs_m < M
    d_ok = offs_d < D
    e_ok = offs_e < DV
    Q += k0_attention_zoff(z, q_n1, q_n2, q_s0, q_s1, q_s2)
    K += k0_attention_zoff(z, k_n1, k_n2, k_s0, k_s1, k_s2)
    V += k0_attention_zoff(z, v_n1, v_n2, v_s0, v_s1, v_s2)
    O += k0_attention_zoff(z, o_n1, o_n2, o_s0, o_s1, o_s2)
    if EVEN_M and EVEN_D:
        q = tl.load(Q + offs_m[:, None] * q_sa + offs_d[None, :] * q_sb)
    else:
        q = tl.load(Q + offs_m[:, None] * q_sa + offs_d[None, :] * q_sb, mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float('-inf'), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    n_full = N // BLOCK_N * BLOCK_N
    lo = 0
    ilo = 0
    hi = tl.minimum(m0 + BLOCK_M + (0), N)
    ihi = tl.minimum(tl.maximum(m0 + (0) + 1, 0) // BLOCK_N * BLOCK_N, n_full)
    ilo = tl.minimum(ilo, hi)
    ihi = tl.maximum(ihi, ilo)
    for start_n in range(ilo, ihi, BLOCK_N):
        offs_n = start_n + offs_n0
        n_ok = offs_n < N
        if EVEN_D:
            k = tl.load(K + offs_d[:, None] * k_sa + offs_n[None, :] * k_sb)
        else:
            k = tl.load(K + offs_d[:, None] * k_sa + offs_n[None, :] * k_sb, mask=d_ok[:, None], other=0.0)
        s = tl.dot(q, k, input_precision='ieee')
        s = s * 0.36067376022224085
        t = s
        m_new = tl.maximum(m_i, tl.max(t, 1))
        m_use = tl.where(m_new == float('-inf'), 0.0, m_new)
        p = tl.exp2(t - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        m_i = m_new
        if EVEN_DV:
            v = tl.load(V + offs_n[:, None] * v_sa + offs_e[None, :] * v_sb)
        else:
            v = tl.load(V + offs_n[:, None] * v_sa + offs_e[None, :] * v_sb, mask=e_ok[None, :], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision='ieee')
    for start_n in range(ihi, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        n_ok = offs_n < N
        k = tl.load(K + offs_d[:, None] * k_sa + offs_n[None, :] * k_sb, mask=d_ok[:, None] & n_ok[None, :], other=0.0)
        s = tl.dot(q, k, input_precision='ieee')
        s = s * 0.25
        sf1 = ((offs_n[None, :] * 1 + 0) - (offs_m[:, None] * 1 + 0))
        sf2 = (sf1 <= 0)
        sf3 = ((sf2 != 0) & (1 != 0))
        sf6 = tl.where(sf3 != 0, 0.0, float('-inf'))
        sf7 = (s + sf6)
        t = sf7 * 1.4426950408889634
        t = tl.where(n_ok[None, :], t, float('-inf'))
        m_new = tl.maximum(m_i, tl.max(t, 1))
        m_use = tl.where(m_new == float('-inf'), 0.0, m_new)
        p = tl.exp2(t - m_use[:, None])
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        m_i = m_new
        v = tl.load(V + offs_n[:, None] * v_sa + offs_e[None, :] * v_sb, mask=n_ok[:, None] & e_ok[None, :], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision='ieee')
    l_i = tl.where(l_i == 0.0, 1.0, l_i)
    acc = acc / l_i[:, None]
    o_ptrs = O + offs_m[:, None] * o_sa + offs_e[None, :] * o_sb
    if EVEN_M and EVEN_DV:
        tl.store(o_ptrs, acc.to(O.dtype.element_ty))
    else:
        tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=m_ok[:, None] & e_ok[None, :])


k0_attention_UPCAST = type(k0_attention_kernel).__name__ == "InterpretedFunction"


def k0_attention(*inputs):
    q = inputs[0]
    q, q_lay = k0_attention_operand(q, 2, 37, 16)
    k = inputs[1]
    k = torch.ops.aten.permute.default(k, [0, 1, 3, 2])
    k, k_lay = k0_attention_operand(k, 2, 16, 37)
    v = inputs[2]
    v, v_lay = k0_attention_operand(v, 2, 37, 16)
    out = torch.empty([1, 2, 37, 16], device=q.device, dtype=torch.float32)
    grid = (_cdiv(37, 64) * 2,)
    k0_attention_kernel[grid](
        q, k, v, out, 37, 37, 16, 16, *q_lay, *k_lay, *v_lay, *(1, 2, 0, 0, 592, 16, 1),
        BLOCK_M=64, BLOCK_N=64, BLOCK_D=16, BLOCK_DV=16,
        EVEN_M=False, EVEN_D=True, EVEN_DV=True, UPCAST=k0_attention_UPCAST,
        num_warps=4, num_stages=2)
    return (out,)


# ---- the reference, verbatim from the problem file ------------------------------------------------------------


import torch, torch.nn as nn, torch.nn.functional as F

class Model(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
def get_inputs(): return [torch.randn(1, 2, 37, 16) for _ in range(3)]
def get_init_inputs(): return []


# ---- end of reference -----------------------------------------------------------------------------------------


class ModelNew(Model):
    """Candidate from kernelevolve's template proposer (defaults): attention."""

    def forward(self, *args):
        if len(args) != 3 or not _kernelevolve_shapes_match(args):
            return super().forward(*args)  # shapes the kernels were not generated for: the reference path
        v_permute_2, = k0_attention(args[0], args[1], args[2])
        return v_permute_2


def _kernelevolve_state(module, *path):
    *owners, leaf = path  # a parameter or buffer by its state_dict name, looked up afresh on every call
    for part in owners:
        module = module._modules[part]
    found = module._parameters.get(leaf)
    return module._buffers[leaf] if found is None else found


def _kernelevolve_shapes_match(args):
    return (tuple(args[0].shape) == (1, 2, 37, 16) and args[0].dtype == torch.float32
            and tuple(args[1].shape) == (1, 2, 37, 16) and args[1].dtype == torch.float32
            and tuple(args[2].shape) == (1, 2, 37, 16) and args[2].dtype == torch.float32)
