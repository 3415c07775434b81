"""The source text of a match: the runtime layout helpers, the flash kernel and its launcher."""
from __future__ import annotations

import inspect
import re
from typing import Any

from kernelevolve.templates.graphutil import pow2

SMEM_BUDGET = 160 * 1024  # bytes of shared memory a config may plan for (H100/H200 allow 227 KB per block)
LOG2E = 1.4426950408889634


# ---- runtime layout helpers, also rendered into the kernel file ------------------------------------------------


def layout_of(x, z, m, k):
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


_LAYOUTS: dict = {}  # (shape, strides, z, m, k) -> layout, or None where the operand needs a copy


def _operand(x, z, m, k):
    key = (x.shape, x.stride(), z, m, k)  # worked out once per shape and strides, not on every call
    lay = _LAYOUTS.get(key, False)
    if lay is False:
        if x.numel() != z * m * k:
            raise ValueError(f"expected {z}x{m}x{k} elements, got shape {tuple(x.shape)}")
        lay = _LAYOUTS[key] = layout_of(x, z, m, k)
    if lay is None:  # batch dims that three strides cannot express: one copy, as the reference's reshape makes
        return _operand(x.reshape(z, m, k), z, m, k)
    return x, lay


def helper_source(name: str) -> str:
    src = "\n\n".join(inspect.getsource(f) for f in (layout_of, _operand))
    src = src.replace("layout_of(", f"{name}_layout(").replace("_operand(", f"{name}_operand(")
    return f"{name}_LAYOUTS = {{}}  # (shape, strides, z, m, k) -> layout, or None where the operand needs a copy\n\n\n" \
        + src.replace("_LAYOUTS", f"{name}_LAYOUTS")


# ---- rendering ---------------------------------------------------------------------------------------------------


def clamp(block: int, size: int) -> int:
    return min(block, max(16, pow2(size)))


def _aux_load(i: int, kind: str) -> str:
    ptr, mask = {"tile": ("offs_m[:, None] * a{i}_sa + offs_n[None, :] * a{i}_sb", "m_ok[:, None] & n_ok[None, :]"),
                 "row": ("offs_m[:, None] * a{i}_sa", "m_ok[:, None]"),
                 "col": ("offs_n[None, :] * a{i}_sb", "n_ok[None, :]"), "scalar": ("0", None)}[kind]
    ptr = ptr.format(i=i)
    return f"a{i} = tl.load(A{i} + {ptr}" + (f", mask={mask}, other=0)" if mask else ")")


def _load(var: str, ptrs: str, mask: str, even: str | None) -> list[str]:
    masked = f"{var} = tl.load({ptrs}, mask={mask}, other=0.0)"
    return [masked] if even is None else [f"if {even}:", f"    {var} = tl.load({ptrs})", "else:", f"    {masked}"]


def _dot(out: str, a: str, b: str, acc: str, dt: str, allow_tf32: bool) -> list[str]:
    """``out = a @ b (+ acc)``. The interpreter multiplies bf16 bit patterns in tl.dot (triton#11584), so there, and
    only there (UPCAST is a constexpr), bf16 operands are widened first."""
    prec = {"tl.float32": f", input_precision='{'tf32' if allow_tf32 else 'ieee'}'"}.get(dt, "")
    line = f"{out} = tl.dot({a}, {b}{acc}{prec})"
    if dt != "tl.bfloat16":
        return [line]
    wide = f"{out} = tl.dot({a}.to(tl.float32), {b}.to(tl.float32){acc}, input_precision='ieee')"
    return ["if UPCAST:", f"    {wide}", "else:", f"    {line}"]


def _body(spec: dict[str, Any], version: str) -> list[str]:
    """One key block: scores, the score chain, then the online-softmax update or the plain accumulation."""
    masked = version == "full"
    lines, out = spec["score"][version]
    softmax = spec["mode"] == "softmax"
    fold = softmax and not masked and out == "s"  # exp2 base folded into the scale: one multiply per score
    scale = spec["scale"] * (LOG2E if fold else 1.0)
    code = ["offs_n = start_n + offs_n0", "n_ok = offs_n < N"]
    kp = "K + offs_d[:, None] * k_sa + offs_n[None, :] * k_sb"
    code += _load("k", kp, "d_ok[:, None] & n_ok[None, :]", None) if masked else _load("k", kp, "d_ok[:, None]",
                                                                                      "EVEN_D")
    code += spec["operands"]["k"]["code"]
    tf32 = bool(spec.get("allow_tf32", False))  # set by the caller from the problem; off unless it says so
    code += _dot("s", "q", "k", "", spec["qk_dtype"], tf32)
    if scale != 1.0:
        code.append(f"s = s * {scale!r}")
    used = set(re.findall(r"\w+", "\n".join(lines)))
    code += [_aux_load(i, a["kind"]) for i, a in enumerate(spec["aux"]) if f"a{i}" in used]
    code += lines
    if softmax:
        code.append(f"t = {out}" if fold else f"t = {out} * {LOG2E}")
        if masked:
            code.append("t = tl.where(n_ok[None, :], t, float('-inf'))")
        code += ["m_new = tl.maximum(m_i, tl.max(t, 1))",
                 "m_use = tl.where(m_new == float('-inf'), 0.0, m_new)",  # rows with no key yet: keep p = 0, not NaN
                 "p = tl.exp2(t - m_use[:, None])", "alpha = tl.exp2(m_i - m_use)",
                 "l_i = l_i * alpha + tl.sum(p, 1)", "acc = acc * alpha[:, None]", "m_i = m_new"]
    else:
        code.append(f"p = {out}")
        if masked:
            code.append("p = tl.where(n_ok[None, :], p, 0.0)")
    vp = "V + offs_n[:, None] * v_sa + offs_e[None, :] * v_sb"
    code += _load("v", vp, "n_ok[:, None] & e_ok[None, :]", None) if masked else _load("v", vp, "e_ok[None, :]",
                                                                                      "EVEN_DV")
    code += spec["operands"]["v"]["code"]
    code += _dot("acc", "p.to(v.dtype)", "v", ", acc", spec["pv_dtype"], tf32)
    return code


def _ranges(band: list[int | None]) -> list[str]:
    """Key-block ranges of one query block: [lo, ilo) and [ihi, hi) need the full mask, [ilo, ihi) does not."""
    lo_b, hi_b = band
    code = ["n_full = N // BLOCK_N * BLOCK_N"]
    if lo_b is None:
        code += ["lo = 0", "ilo = 0"]
    else:
        code += [f"lo = tl.maximum(m0 + ({lo_b}), 0) // BLOCK_N * BLOCK_N",
                 f"ilo = (tl.maximum(m0 + BLOCK_M - 1 + ({lo_b}), 0) + BLOCK_N - 1) // BLOCK_N * BLOCK_N",
                 "ilo = tl.maximum(ilo, lo)"]
    if hi_b is None:
        code += ["hi = N", "ihi = n_full"]
    else:
        code += [f"hi = tl.minimum(m0 + BLOCK_M + ({hi_b}), N)",
                 f"ihi = tl.minimum(tl.maximum(m0 + ({hi_b}) + 1, 0) // BLOCK_N * BLOCK_N, n_full)"]
    return code + ["ilo = tl.minimum(ilo, hi)", "ihi = tl.maximum(ihi, ilo)"]


def _indent(lines: list[str], depth: int) -> str:
    return "\n".join(" " * (4 * depth) + line for line in lines)


def kernel_source(spec: dict[str, Any], name: str) -> str:
    tensors = ["q", "k", "v", "o"] + [f"a{i}" for i in range(len(spec["aux"]))]
    ptrs = ", ".join(t.upper() for t in tensors)
    lays = ",\n    ".join(", ".join(f"{t}_{f}" for f in ("n1", "n2", "s0", "s1", "s2", "sa", "sb")) for t in tensors)
    softmax = spec["mode"] == "softmax"
    start = "num_m - 1 - pid % num_m" if spec["band"][1] is not None else "pid % num_m"  # longest rows first
    head = [
        "pid = tl.program_id(0)", "num_m = tl.cdiv(M, BLOCK_M)", "z = (pid // num_m).to(tl.int64)",
        f"m0 = ({start}) * BLOCK_M", "offs_m = m0 + tl.arange(0, BLOCK_M)", "offs_n0 = tl.arange(0, BLOCK_N)",
        "offs_d = tl.arange(0, BLOCK_D)", "offs_e = tl.arange(0, BLOCK_DV)",
        "m_ok = offs_m < M", "d_ok = offs_d < D", "e_ok = offs_e < DV",
        *[f"{t.upper()} += {name}_zoff(z, {t}_n1, {t}_n2, {t}_s0, {t}_s1, {t}_s2)" for t in tensors],
        *_load("q", "Q + offs_m[:, None] * q_sa + offs_d[None, :] * q_sb", "m_ok[:, None] & d_ok[None, :]",
               "EVEN_M and EVEN_D"),
        *spec["operands"]["q"]["code"],
        "m_i = tl.full([BLOCK_M], float('-inf'), tl.float32)", "l_i = tl.zeros([BLOCK_M], tl.float32)",
        "acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)", *_ranges(spec["band"])]
    full, interior = _body(spec, "full"), _body(spec, "interior")
    loops = [("lo, ilo", full)] if spec["band"][0] is not None else []
    loops = [line for bounds, body in [*loops, ("ilo, ihi", interior), ("ihi, hi", full)]
             for line in [f"for start_n in range({bounds}, BLOCK_N):", *("    " + b for b in body)]]
    tail = []
    if softmax:
        if spec["zero_empty"]:
            tail.append("l_i = tl.where(l_i == 0.0, 1.0, l_i)")  # SDPA: a row with no key left is 0
        tail.append("acc = acc / l_i[:, None]")  # plain softmax keeps 0 / 0 = NaN there, as torch does
    tail += ["o_ptrs = O + offs_m[:, None] * o_sa + offs_e[None, :] * o_sb", "if EVEN_M and EVEN_DV:",
             "    tl.store(o_ptrs, acc.to(O.dtype.element_ty))", "else:",
             "    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=m_ok[:, None] & e_ok[None, :])"]
    return f'''
@triton.jit
def {name}_zoff(z, n1, n2, s0, s1, s2):
    return (z // (n1 * n2)) * s0 + ((z // n2) % n1) * s1 + (z % n2) * s2


@triton.jit
def {name}_kernel(
    {ptrs}, M, N, D, DV,
    {lays},
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    EVEN_M: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, UPCAST: tl.constexpr,
):
{_indent(head, 1)}
{_indent(loops, 1)}
{_indent(tail, 1)}


{name}_UPCAST = type({name}_kernel).__name__ == "InterpretedFunction"
'''


def launch_config(spec: dict[str, Any], config: dict[str, Any]) -> dict[str, int]:
    """Blocks clamped to the problem, and stages/key block cut until the pipelined tiles fit in shared memory."""
    _, m, n, d, dv = spec["sizes"]
    bm, bn = clamp(int(config["BLOCK_M"]), m), clamp(int(config["BLOCK_N"]), n)
    bd, bdv, stages = max(16, pow2(d)), max(16, pow2(dv)), int(config["num_stages"])
    esize = 4 if spec["qk_dtype"] == "tl.float32" else 2

    def smem(stages: int, bn: int) -> int:
        return esize * (bm * bd + stages * bn * (bd + bdv) + bm * bn)

    while smem(stages, bn) > SMEM_BUDGET and stages > 1:
        stages -= 1
    while smem(stages, bn) > SMEM_BUDGET and bn > 16:
        bn //= 2
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_D": bd, "BLOCK_DV": bdv, "num_warps": int(config["num_warps"]),
            "num_stages": stages}


def launcher_source(spec: dict[str, Any], name: str, cfg: dict[str, int]) -> str:
    z, m, n, d, dv = spec["sizes"]
    ops = spec["operands"]
    body = []
    for role, (rows, cols) in (("q", (m, d)), ("k", (d, n)), ("v", (n, dv))):
        body += [f"{role} = inputs[{ops[role]['input']}]", *ops[role]["replay"],
                 f"{role}, {role}_lay = {name}_operand({role}, {z}, {rows}, {cols})"]
    for i, a in enumerate(spec["aux"]):
        strides = ", ".join("0" if dim is None else f"a{i}.stride({dim})" for dim in a["dims"])
        body += [f"a{i} = inputs[{a['input']}]",
                 f"a{i}, a{i}_lay = {name}_operand(a{i}.as_strided({a['sizes']}, [{strides}]), {z}, {m}, {n})"]
    aux = "".join(f"a{i}, " for i in range(len(spec["aux"])))
    aux_lays = "".join(f", *a{i}_lay" for i in range(len(spec["aux"])))
    out = spec["out"]
    body += [f"out = torch.empty({out['shape']}, device=q.device, dtype={out['dtype']})",
             f"grid = (_cdiv({m}, {cfg['BLOCK_M']}) * {z},)",
             f"{name}_kernel[grid](",
             f"    q, k, v, out, {aux}{m}, {n}, {d}, {dv}, *q_lay, *k_lay, *v_lay, *{tuple(out['layout'])}{aux_lays},",
             f"    BLOCK_M={cfg['BLOCK_M']}, BLOCK_N={cfg['BLOCK_N']}, BLOCK_D={cfg['BLOCK_D']}, "
             f"BLOCK_DV={cfg['BLOCK_DV']},",
             f"    EVEN_M={m % cfg['BLOCK_M'] == 0}, EVEN_D={d == cfg['BLOCK_D']}, EVEN_DV={dv == cfg['BLOCK_DV']}, "
             f"UPCAST={name}_UPCAST,",
             f"    num_warps={cfg['num_warps']}, num_stages={cfg['num_stages']})",
             "return (out,)"]
    return f"def {name}(*inputs):\n{_indent(body, 1)}\n"

