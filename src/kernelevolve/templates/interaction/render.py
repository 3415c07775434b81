"""The rendered interaction source: the DLRM kernel (Z = T T^T per batch row, pairs gathered from registers) and the
FM kernel, each with its launcher."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from kernelevolve.analyze.graph import dtype
from kernelevolve.analyze.pointwise import TL_DTYPES, emit
from kernelevolve.templates.base import Match
from kernelevolve.templates.graphutil import pow2

HALF = (torch.float16, torch.bfloat16)


# ---- rendering: DLRM -------------------------------------------------------------------------------------------------

_DOT_KERNEL = '''
@triton.jit
def {name}_kernel({params}out_ptr, B, D, stride_o,
        BLOCK_B: tl.constexpr, F: tl.constexpr, F_PAD: tl.constexpr, BLOCK_K: tl.constexpr, P: tl.constexpr,
        P_PAD: tl.constexpr):
    fi = tl.arange(0, F_PAD)
    p = tl.arange(0, P_PAD)
    pmask = p < P
{positions}
    for r in tl.static_range(BLOCK_B):
        # rows past the end redo the last row: the same values to the same place, no batch mask needed
        b = tl.minimum(tl.program_id(0) * BLOCK_B + r, B - 1).to(tl.int64)
{rows}
        z = tl.zeros([F_PAD, F_PAD], tl.float32)
        for k0 in range(0, D, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            t = tl.load(rowp[:, None] + k[None, :]{sk}, mask=(fi < F)[:, None] & (k < D)[None, :], other=0.0)
            z = tl.dot({operands}, z, input_precision="{precision}")
        v = tl.gather(tl.reshape(z, [F_PAD * F_PAD]), flat, 0)
        tl.store(out_ptr + b * stride_o + {col} + p, v{cast}, mask=pmask)
{copies}
'''

_DOT_LAUNCHER = '''
{name}_cache = {{}}


def {name}(*inputs):
    B = {B}
    out = torch.empty(({B}, {width}), dtype={out_dtype}, device=inputs[0].device)
{prep}
    grid = (_cdiv(B, {BLOCK_B}),)
    {name}_kernel[grid]({args}out, B, {D}, out.stride(0),
        BLOCK_B={BLOCK_B}, F={F}, F_PAD={F_PAD}, BLOCK_K={BLOCK_K}, P={P}, P_PAD={P_PAD},
        num_warps={num_warps}, num_stages={num_stages})
    return (out,)
'''


def _positions(spec: dict, name: str) -> tuple[list[str], list[str], list[str], list[str]]:
    """Kernel lines giving ``flat`` (pair positions in the flattened Z tile), with params, launcher lines and args."""
    if "flat" in spec:
        prep = [f"pos = {name}_cache.get(out.device)", "if pos is None:",
                f"    pos = {name}_cache[out.device] = torch.tensor({name}_FLAT, dtype=torch.int32, "
                "device=out.device)"]
        return ["flat = tl.load(pos_ptr + p, mask=pmask, other=0)"], ["pos_ptr"], prep, ["pos"]
    f, lines = spec["F"], []
    names = ["li", "lj"] if spec["index"] == 3 else ["lf"]
    for n, k in zip(names, spec["pairs"]):
        lines.append(f"{n} = tl.load({n}_ptr + p, mask=pmask, other=0).to(tl.int32)")
    if spec["index"] == 3:
        lines += ["li = tl.minimum(tl.maximum(tl.where(li < 0, li + F, li), 0), F - 1)",
                  "lj = tl.minimum(tl.maximum(tl.where(lj < 0, lj + F, lj), 0), F - 1)", "flat = li * F_PAD + lj"]
    else:
        lines += [f"lf = lf % {f * f}", f"lf = tl.where(lf < 0, lf + {f * f}, lf)", "flat = (lf // F) * F_PAD + lf % F"]
    prep = [f"{n} = inputs[{k}].contiguous()" for n, k in zip(names, spec["pairs"])]
    prep += [f"assert {n}.numel() == {spec['P']}, 'index pairs of the traced count expected'" for n in names]
    return lines, [f"{n}_ptr" for n in names], prep, names


def _copies(match: Match, out_dtype: str) -> tuple[list[str], list[str], list[str], int]:
    """Kernel lines copying the other ``cat`` pieces into their columns; params, args and the pairs' column."""
    spec, lines, params, args, col, pair_col = match.spec, [], [], [], 0, 0
    for k, (pos, w) in enumerate(zip(spec["pieces"], spec["widths"])):
        if pos < 0:
            pair_col = col
        else:
            params += [f"c{k}_ptr", f"c{k}_s0", f"c{k}_s1"]
            args += [f"inputs[{pos}]", f"inputs[{pos}].stride(0)", f"inputs[{pos}].stride(1)"]
            lines += [f"ck = tl.arange(0, {pow2(w)})",
                      f"v = tl.load(c{k}_ptr + b * c{k}_s0 + ck * c{k}_s1, mask=ck < {w}, other=0)",
                      f"tl.store(out_ptr + b * stride_o + {col} + ck, v.to({out_dtype}), mask=ck < {w})"]
        col += w
    return lines, params, args, pair_col


def _rows(spec: dict) -> tuple[list[str], str, list[str], list[str], list[str]]:
    """Kernel lines giving ``rowp``, the address of each feature row of batch row b (a feature may come from any
    piece of the input ``cat``), the inner stride, params, launcher lines and args."""
    if not spec["feats"]:
        sb, si, sk = spec["strides"]
        prep = ["x = inputs[0].contiguous()", f"assert x.shape == {tuple(spec['x_shape'])}, 'features of the "
                "traced shape expected'"]
        return [f"rowp = x_ptr + b * {sb} + fi * {si}"], f" * {sk}", ["x_ptr"], prep, \
            [f"x.reshape(-1)[{spec['offset']}:]"]
    lines, params, prep, args = [], [], [], []
    for k, (pos, f0, n, rank, view) in enumerate(spec["feats"]):
        row = f"f{k}_ptr + b * f{k}_sb + (fi - {f0}) * f{k}_sf"
        lines.append(f"rowp = tl.where(fi >= {f0}, {row}, rowp)" if k else f"rowp = {row}")
        params += [f"f{k}_ptr", f"f{k}_sb", f"f{k}_sf"]
        piece = f"inputs[{pos}].reshape({tuple(view)})" if view else f"inputs[{pos}]"
        prep += [f"f{k} = {piece}", f"f{k} = f{k} if f{k}.stride(-1) == 1 else f{k}.contiguous()",
                 f"assert f{k}.shape[0] == B, 'features of the traced batch expected'"]
        args += [f"f{k}", f"f{k}.stride(0)", f"f{k}.stride(1)" if rank == 3 else f"{spec['D']} * f{k}.stride(1)"]
    return lines, "", params, prep, args


def render_dot(match: Match, config: dict[str, Any], name: str) -> str:
    spec = match.spec
    out = match.outputs[0]
    pairs_node = next(n for n in match.nodes if n.name == spec["pick"])
    out_dtype = TL_DTYPES[dtype(out)]
    load_lines, sk, load_params, load_prep, load_args = _rows(spec)
    pos_lines, pos_params, prep, pos_args = _positions(spec, name)
    copy_lines, copy_params, copy_args, col = _copies(match, out_dtype)
    cast = f".to({TL_DTYPES[dtype(pairs_node)]})" + (f".to({out_dtype})" if dtype(pairs_node) != dtype(out) else "")
    # half inputs: tf32 on the up-cast tile is exact (11-bit significands) and is the same MMA arithmetic
    if dtype(pairs_node) == torch.float32:
        operands = "t, tl.trans(t)"
        precision = config.get("INPUT_PRECISION", "tf32" if spec.get("allow_tf32") else "ieee")
    else:
        operands, precision = "t.to(tl.float32), tl.trans(t).to(tl.float32)", "tf32"
    kernel = _DOT_KERNEL.format(
        name=name, params="".join(p + ", " for p in load_params + pos_params + copy_params),
        positions="\n".join("    " + ln for ln in pos_lines), rows="\n".join(" " * 8 + ln for ln in load_lines), sk=sk,
        operands=operands, precision=precision, col=col, cast=cast,
        copies="\n".join("        " + ln for ln in copy_lines))
    block_k = max(16, min(pow2(spec["D"]), int(config.get("BLOCK_K", 128))))
    launcher = _DOT_LAUNCHER.format(
        name=name, B=spec["B"], prep="\n".join("    " + p for p in load_prep + prep), width=sum(spec["widths"]),
        out_dtype=dtype(out), args="".join(a + ", " for a in load_args + pos_args + copy_args), D=spec["D"],
        BLOCK_B=int(config.get("BLOCK_B", 1)), F=spec["F"], F_PAD=max(16, pow2(spec["F"])), BLOCK_K=block_k,
        P=spec["P"], P_PAD=pow2(spec["P"]), num_warps=int(config.get("num_warps", 4)),
        num_stages=int(config.get("num_stages", 1)))
    table = f"\n{name}_FLAT = {spec['flat']!r}\n" if "flat" in spec else ""
    return table + kernel + launcher


# ---- rendering: FM ---------------------------------------------------------------------------------------------------

_FM_KERNEL = '''
@triton.jit
def {name}_kernel(x_ptr, out_ptr, B, D, sb, sf, sd,
        BLOCK_B: tl.constexpr, F: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B)
    fs = tl.arange(0, BLOCK_F)
    bmask = rows < B
    tot = tl.zeros([BLOCK_B], tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        dmask = d < D
        m = bmask[:, None, None] & (fs < F)[None, :, None] & dmask[None, None, :]
        ptr = x_ptr + rows[:, None, None] * sb + fs[None, :, None] * sf + d[None, None, :] * sd
        xs = tl.load(ptr, mask=m, other=0.0).to(tl.float32)
{inner}
{after}
'''

_FM_LAUNCHER = '''
def {name}(*inputs):
    x = inputs[0]
    assert x.dim() == 3, 'x must be [batch, fields, dim]'
    B, F, D = x.shape[{b}], x.shape[{f}], x.shape[{d}]
    assert (B, F, D) == ({B}, {F}, {D}), 'x of the traced shape expected'
    out = torch.empty({out_shape}, dtype={out_dtype}, device=x.device)
    grid = (_cdiv(B, {BLOCK_B}),)
    {name}_kernel[grid](x, out, B, D, x.stride({b}), x.stride({f}), x.stride({d}),
        BLOCK_B={BLOCK_B}, F={F}, BLOCK_F={BLOCK_F}, BLOCK_D={BLOCK_D},
        num_warps={num_warps}, num_stages={num_stages})
    return (out,)
'''


def _rounded(var: str, node: fx.Node) -> list[str]:
    """Where the graph holds a value in half precision, round it as the graph does."""
    dt = dtype(node)
    return [f"{var} = {var}.to({TL_DTYPES[dt]}).to(tl.float32)"] if dt in HALF else []


def _chain(nodes: list[fx.Node], env: dict[fx.Node, str], prefix: str) -> tuple[list[str], str]:
    lines: list[str] = []
    var = next(iter(env.values()))
    for i, n in enumerate(nodes):
        env = emit([n], env, lines, prefix=f"{prefix}{i}_")
        var = env[n]
        lines += _rounded(var, n)
    return lines, var


def render_fm(match: Match, config: dict[str, Any], name: str) -> str:
    spec = match.spec
    by_name = {n.name: n for n in match.nodes}
    r = {k: by_name[v] for k, v in spec["roles"].items()}
    inner = ["s = tl.sum(xs, 1)", *_rounded("s", r["S"]), "a = s * s", *_rounded("a", r["A"]),
             "x2 = xs * xs", *_rounded("x2", r["X2"]), "q = tl.sum(x2, 1)", *_rounded("q", r["Q"]),
             "v = a - q", *_rounded("v", r["sub"])]
    pre, var = _chain([by_name[n] for n in spec["pre"]], {r["sub"]: "v"}, "p")
    inner += pre
    out_dtype = TL_DTYPES[dtype(match.outputs[0])]
    after: list[str] = []
    if spec["dsum"]:
        inner.append(f"tot += tl.sum(tl.where(dmask[None, :], {var}, 0.0), 1)")
        dsum = by_name[spec["dsum"]]
        post, var = _chain([by_name[n] for n in spec["post"]], {dsum: "tot"}, "q")
        after = _rounded("tot", dsum) + post + [f"tl.store(out_ptr + rows, {var}.to({out_dtype}), mask=bmask)"]
    else:
        inner.append(f"tl.store(out_ptr + rows[:, None] * D + d[None, :], {var}.to({out_dtype}), "
                     "mask=bmask[:, None] & dmask[None, :])")
    block_f = pow2(spec["F"])
    block_d = min(pow2(spec["D"]), max(16, 4096 // block_f))
    block_b = max(1, min(int(config.get("BLOCK_B", 1)), 8192 // (block_f * block_d)))
    b, f, d = spec["dims"]
    kernel = _FM_KERNEL.format(name=name, inner="\n".join("        " + ln for ln in inner),
                               after="\n".join("    " + ln for ln in after))
    shape_text = "(" + "".join(f"{s}, " for s in spec["out_shape"]) + ")"
    launcher = _FM_LAUNCHER.format(
        name=name, b=b, f=f, d=d, B=spec["B"], F=spec["F"], D=spec["D"], out_shape=shape_text,
        out_dtype=dtype(match.outputs[0]),
        BLOCK_B=block_b, BLOCK_F=block_f, BLOCK_D=block_d, num_warps=int(config.get("num_warps", 4)),
        num_stages=int(config.get("num_stages", 1)))
    return kernel + launcher
