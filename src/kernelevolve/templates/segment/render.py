"""The rendered segment-reduction source: one program pools one bag for one block of D; the launcher reads the bag
layout."""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx as fx

from kernelevolve.analyze.graph import dtype
from kernelevolve.analyze.pointwise import TL_DTYPES, can_emit, compute_dtype, emit
from kernelevolve.templates.base import Match
from kernelevolve.templates.graphutil import pow2

# Bags read from offsets or lengths end at row N at the latest: a search over arange(N) puts no row past it in a bag.
_CLAMP = ["end = tl.minimum(end, N)", "start = tl.minimum(start, end)"]
_BOUNDS = {
    "offsets": ["start = tl.load(bnd_ptr + bag).to(tl.int64)",
                "end = tl.load(bnd_ptr + bag + 1, mask=bag + 1 < n_bnd, other=N).to(tl.int64)", *_CLAMP],
    "ids": ["start = tl.load(bnd_ptr + bag).to(tl.int64)", "end = tl.load(bnd_ptr + bag + 1).to(tl.int64)"],
    "lengths": ["end = tl.load(end_ptr + bag).to(tl.int64)", "start = end - tl.load(len_ptr + bag).to(tl.int64)",
                *_CLAMP],
    "fixed": ["start = bag.to(tl.int64) * {L}", "end = start + {L}"],
}
_FROM_ZERO = "start = tl.where(bag == 0, 0, start)"
_BOUND_PARAMS = {"offsets": ["bnd_ptr", "n_bnd"], "ids": ["bnd_ptr", "perm_ptr"], "lengths": ["end_ptr", "len_ptr"],
                 "fixed": []}


def _lit(v: float) -> str:
    return f"float('{v}')" if math.isinf(v) or math.isnan(v) else repr(float(v))


def _loop(spec: dict, gather: bool) -> list[str]:
    reduce, pad = spec["reduce"], spec.get("padding_idx")
    lines = ["pos = j + tl.arange(0, BLOCK_L)", "lmask = pos < end"]
    lines.append("src = tl.load(perm_ptr + pos, mask=lmask, other=0)" if spec["bags"] == "ids" else "src = pos")
    lines.append("row = tl.load(idx_ptr + src, mask=lmask, other=0).to(tl.int64)" if gather else "row = src")
    if pad is not None:
        lines += [f"lmask = lmask & (row != {pad})", "cnt += lmask.to(tl.int32)"]
    lines += ["if EVEN_D:", "    m2 = lmask[:, None]", "else:", "    m2 = lmask[:, None] & dmask[None, :]",
              "x = tl.load(src_ptr + row[:, None] * stride_v + d[None, :] * stride_d, mask=m2, other=0.0)",
              "x = x.to(tl.float32)"]
    if "psw" in spec["roles"]:
        lines.append("x = x * tl.load(psw_ptr + src, mask=lmask, other=0.0).to(tl.float32)[:, None]")
    if reduce in ("sum", "mean"):
        lines.append("acc += x")
    else:
        fn, fill = ("maximum", "-inf") if reduce == "max" else ("minimum", "inf")
        lines.append(f"acc = tl.{fn}(acc, tl.where(m2, x, float('{fill}')))")
    return lines


def _finish(spec: dict) -> tuple[list[str], list[str]]:
    reduce, init = spec["reduce"], spec["init"]
    fill = {"sum": "0.0", "mean": "0.0", "max": "float('-inf')", "min": "float('inf')"}[reduce]
    lines = [f"r = tl.{ {'max': 'max', 'min': 'min'}.get(reduce, 'sum')}(acc, 0)"]
    lines.append("n = tl.sum(cnt, 0)" if spec.get("padding_idx") is not None else "n = end - start")
    if init is not None:
        lines.append({"max": f"r = tl.maximum(r, {_lit(init)})", "min": f"r = tl.minimum(r, {_lit(init)})"}
                     .get(reduce, f"r = r + {_lit(init)}"))
    if reduce == "mean":
        lines.append(f"r = r / tl.maximum(n + {spec['extra']}, 1).to(tl.float32)")
    if spec["bags"] != "fixed" or spec.get("padding_idx") is not None:
        lines.append(f"r = tl.where(n == 0, {_lit(spec['empty'])}, r)")
    return [f"acc = tl.full([BLOCK_L, BLOCK_D], {fill}, tl.float32)"], lines


def _epilogue(match: Match, lines: list[str]) -> list[str]:
    """Loads of the epilogue's side inputs and its statements; returns the names of the values to store."""
    spec = match.spec
    by_name = {n.name: n for n in match.nodes}
    pooled = by_name[spec["pooled"]]
    if dtype(pooled) in (torch.float16, torch.bfloat16) and spec["epilogue"]:
        lines.append(f"r = r.to({TL_DTYPES[dtype(pooled)]}).to(tl.float32)")  # the graph rounds the pooled rows
    env: dict[fx.Node, str] = {pooled: "r", **{by_name[c]: "n" for c in spec.get("counts", [])}}
    loads = {"tile": "tl.load(x{k}_ptr + bag * x{k}_sb + d * x{k}_sd, mask=dmask, other=0)",
             "row": "tl.load(x{k}_ptr + bag * x{k}_sb)", "col": "tl.load(x{k}_ptr + d * x{k}_sd, mask=dmask, other=0)",
             "scalar": "tl.load(x{k}_ptr)"}
    for k, (cls, _, _) in spec["sides"].items():
        inp = match.inputs[int(k)]
        lines.append(f"s{k} = {loads[cls].format(k=k)}.to({compute_dtype(dtype(inp))})")
        env[inp] = f"s{k}"
    for i, name in enumerate(spec["epilogue"]):
        n = by_name[name]
        if can_emit(n):
            env = emit([n], env, lines, prefix=f"e{i}_")
        else:  # a view of a per-bag value: the same scalar in the kernel
            env[n] = env[n.args[0]]
    return [env[o] for o in match.outputs]


_KERNEL = '''
@triton.jit
def {name}_kernel({params}, N, D, stride_v, stride_d,
        BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr):
    bag = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
{body}
'''

_LAUNCHER = '''
def {name}(*inputs):
    src = inputs[{src}]
{prep}
    D = src.shape[1]
    outs = [torch.empty({shape}, dtype=dt, device=src.device) for dt in ({dtypes})]
    if S > 0 and D > 0:
        grid = (S, _cdiv(D, {BLOCK_D}))
        {name}_kernel[grid]({args}, N, D, src.stride(0), src.stride(1),
            BLOCK_L={BLOCK_L}, BLOCK_D={BLOCK_D}, EVEN_D=D % {BLOCK_D} == 0,
            num_warps={num_warps}, num_stages={num_stages})
    return tuple(outs)
'''


def _flat(match: Match, k: int) -> str:
    """The launcher's ``inputs[k]`` as a 1-D tensor: as it comes where the graph traced it 1-D (the candidate's
    guard holds every input's rank), else reshaped; a reshape costs a call's host about a microsecond, and a
    DLRM's grouped bags read twenty such inputs."""
    val = getattr(match.inputs[k], "meta", {}).get("val")
    return f"inputs[{k}]" if isinstance(val, torch.Tensor) and val.dim() == 1 else f"inputs[{k}].reshape(-1)"


def _prep(match: Match, gather: bool) -> tuple[list[str], list[str]]:
    """Launcher statements that read the bag layout, and the kernel arguments they provide."""
    spec = match.spec
    r, bags = spec["roles"], spec["bags"]
    lines = [f"idx = {_flat(match, r['idx'])}", "N = idx.numel()",
             "assert src.dim() == 2, 'the table must be 2-D'"] if gather else [
        "assert src.dim() == 2, 'the values must be 2-D'", "N = src.shape[0]"]
    args = ["src", "idx"] if gather else ["src"]
    if bags == "offsets":
        lines += [f"bnd = {_flat(match, r['offsets'])}",
                  f"S = bnd.numel() - {int(bool(spec.get('include_last')))}"]
        args += ["bnd", "bnd.numel()"]
    elif bags == "lengths":
        lines += [f"lens = {_flat(match, r['lengths'])}", "ends = torch.cumsum(lens, 0)", "S = lens.numel()"]
        args += ["ends", "lens"]
    elif bags == "fixed":
        lines += [f"assert N % {spec['L']} == 0, 'indices do not split into bags of {spec['L']}'",
                  f"S = N // {spec['L']}"]
    else:
        lines += [f"ids = {_flat(match, r['ids'])}", "assert ids.numel() == N, 'one segment id per row'",
                  f"S = {spec['S']}", "perm = torch.argsort(ids, stable=True)",
                  "bnd = torch.searchsorted(ids[perm], torch.arange(S + 1, device=ids.device, dtype=ids.dtype))"]
        args += ["bnd", "perm"]
    if "psw" in r:
        lines.append(f"psw = {_flat(match, r['psw'])}")
        args.append("psw")
    return lines, args


def _blocks(spec: dict, config: dict[str, Any]) -> tuple[int, int]:
    """BLOCK_D and BLOCK_L of ``config``, each no larger than the power of two its extent needs."""
    return (min(int(config.get("BLOCK_D", 128)), pow2(spec["D"])),
            min(int(config.get("BLOCK_L", 16)), pow2(spec.get("L", 1 << 20))))


def _pool(spec: dict, gather: bool) -> list[str]:
    """The statements that pool one bag for one block of D into ``r`` (and its count into ``n``)."""
    init, finish = _finish(spec)
    body = [line.format(L=spec.get("L")) for line in _BOUNDS[spec["bags"]]]
    body = body[:1] + [_FROM_ZERO] * bool(spec.get("from_zero")) + body[1:] + init
    if spec.get("padding_idx") is not None:
        body.append("cnt = tl.zeros([BLOCK_L], tl.int32)")
    return body + ["for j in range(start, end, BLOCK_L):"] + ["    " + ln for ln in _loop(spec, gather)] + finish


def render_segment(match: Match, config: dict[str, Any], name: str) -> str:
    spec = match.spec
    if "group" in spec:
        return render_group(match, config, name)
    gather = "table" in spec["roles"]
    block_d, block_l = _blocks(spec, config)
    params = ["src_ptr"] + (["idx_ptr"] if gather else []) + _BOUND_PARAMS[spec["bags"]]
    params += ["psw_ptr"] if "psw" in spec["roles"] else []
    prep, args = _prep(match, gather)
    for k, (cls, bdim, ddim) in spec["sides"].items():
        params.append(f"x{k}_ptr")
        args.append(f"inputs[{k}]")
        for tag, dim, used in (("sb", bdim, cls in ("tile", "row")), ("sd", ddim, cls in ("tile", "col"))):
            if used:
                params.append(f"x{k}_{tag}")
                args.append(f"inputs[{k}].stride({dim})")
    outs = [f"out{i}_ptr" for i in range(len(match.outputs))]
    body = _pool(spec, gather)
    values = _epilogue(match, body)
    for i, (v, o) in enumerate(zip(values, match.outputs)):
        body.append(f"tl.store(out{i}_ptr + bag * D + d, {v}.to({TL_DTYPES[dtype(o)]}), mask=dmask)")
    shape_text = "(" + ", ".join(["S", *map(str, spec["tile"][1:-1]), "D"]) + ",)"
    kernel = _KERNEL.format(name=name, params=", ".join(params + outs), body="\n".join("    " + b for b in body))
    launcher = _LAUNCHER.format(
        name=name, src=spec["roles"].get("table", spec["roles"].get("values")),
        prep="\n".join("    " + p for p in prep),
        shape=shape_text, dtypes="".join(f"{dtype(o)}, " for o in match.outputs),
        args=", ".join(args + ["outs[%d]" % i for i in range(len(outs))]), BLOCK_D=block_d, BLOCK_L=block_l,
        num_warps=int(config.get("num_warps", 4)), num_stages=int(config.get("num_stages", 1)))
    return kernel + launcher


# Several bags of one kind (tables of one width and dtype, each with its own indices and offsets, as a DLRM's ten
# embedding bags): one launch for all of them. The kernel's third grid axis picks the table; each table's input
# pointers and sizes are a row of an int64 layout tensor, not arguments of their own: a launch's host cost grows with
# its argument count (ten tables passed one by one were 91 arguments; now 12, the outputs and the layout). The outputs
# stay arguments: they are new on every call, where the layout is kept per set of inputs.
_ONE = '''
@triton.jit
def {name}_one(src_ptr, idx_ptr, bnd_ptr, n_bnd, out0_ptr, N, D, stride_v, stride_d, bag, d, dmask,
        BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr):
{body}
'''

# a table's row of the layout: its table, indices and offsets (addresses), the offsets' and indices' counts, its bag
# count and the table's strides; the kernel's loads (m + 5 is S) and the layout's values follow this order
_FIELDS = ("src", "idx", "bnd", "nb", "N", "S", "sv", "sd")

_GROUP_KERNEL = '''
@triton.jit
def {name}_kernel(meta_ptr, {outs}, D, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
        UNIT_D: tl.constexpr, ALIGNED: tl.constexpr):
    bag = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
    t = tl.program_id(2)
    m = meta_ptr + t * {width}
    if bag < tl.load(m + 5):
        src = tl.load(m).to(tl.pointer_type({src_t}))
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
{pick_out}
{calls}
'''

_GROUP_LAUNCHER = '''
{name}_layouts = {{}}


def {name}_layout(srcs, idxs, bnds, S):
    """The kernel's layout tensor for these tables, indices and offsets, with its UNIT_D and ALIGNED flags; kept per
    layout, so a call on the same tensors (a model's weights, a loop's input buffers) copies nothing to the device.
    A layout first used while a CUDA graph is captured is kept for good: the graph reads it on every replay."""
    # the key in three sweeps of tensor methods with no Python loop (a call's host time is mostly such small steps)
    ptrs = tuple(map(torch.Tensor.data_ptr, srcs + idxs + bnds))
    counts = tuple(map(torch.Tensor.numel, idxs + bnds))
    strides = tuple(map(torch.Tensor.stride, srcs))
    key = (ptrs, counts, strides)
    hit = {name}_layouts.get(key)
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
        loose = [k for k, v in {name}_layouts.items() if not v[3]]
        if len(loose) >= 64:
            del {name}_layouts[loose[0]]
        hit = {name}_layouts[key] = [meta, unit_d, aligned, capturing, host]
    hit[3] = hit[3] or capturing
    return hit[0], hit[1], hit[2]


def {name}(*inputs):
    srcs = [inputs[k] for k in {tables}]
    idxs = [{idx}]
    bnds = [{offsets}]
    D = srcs[0].shape[1]
    S = [b.numel() - {include_last} for b in bnds]
    outs = [torch.empty((s, D), dtype={dtype}, device=srcs[0].device) for s in S]
    if max(S) > 0 and D > 0:
        meta, unit_d, aligned = {name}_layout(srcs, idxs, bnds, S)
        {name}_kernel[(max(S), _cdiv(D, {BLOCK_D}), {n})](meta, *outs, D, BLOCK_L={BLOCK_L}, BLOCK_D={BLOCK_D},
            EVEN_D=D % {BLOCK_D} == 0, UNIT_D=unit_d, ALIGNED=aligned, num_warps={num_warps}, num_stages={num_stages})
    return tuple(outs)
'''


def _calls(name: str, kinds: list[tuple[str, str]]) -> list[str]:
    """The kernel's call of the pooling body with each table's index and offset pointers typed: one call where every
    table's indices and offsets have one dtype each, else one branch a table."""
    def call(idx_t: str, bnd_t: str) -> list[str]:
        return [f"idx = tl.load(m + 1).to(tl.pointer_type({idx_t}))",
                f"bnd = tl.load(m + 2).to(tl.pointer_type({bnd_t}))",
                f"{name}_one(src, idx, bnd, nb, out, n, D, sv, sd, bag, d, dmask, BLOCK_L, BLOCK_D, EVEN_D)"]
    if len(set(kinds)) == 1:
        return call(*kinds[0])
    lines = []
    for t, kind in enumerate(kinds):
        lines += [f"{'if' if t == 0 else 'elif'} t == {t}:"] + ["    " + c for c in call(*kind)]
    return lines


def render_group(match: Match, config: dict[str, Any], name: str) -> str:
    """One kernel for the bags of ``match.spec["group"]`` (each a bag's spec, its roles indexing the match's inputs),
    which differ only in their tables, indices and offsets."""
    spec = match.spec
    first = spec["group"][0]
    block_d, block_l = _blocks(spec, config)
    body = _pool(first, True)
    body.append(f"tl.store(out0_ptr + bag * D + d, r.to({TL_DTYPES[dtype(match.outputs[0])]}), mask=dmask)")
    roles = [g["roles"] for g in spec["group"]]
    n = len(roles)
    kinds = [(TL_DTYPES[dtype(match.inputs[r["idx"]])], TL_DTYPES[dtype(match.inputs[r["offsets"]])]) for r in roles]
    pick = ["out = out0"] + [f"{'if' if t == 1 else 'elif'} t == {t}:\n            out = out{t}" for t in range(1, n)]
    kernel = _GROUP_KERNEL.format(name=name, width=len(_FIELDS), outs=", ".join(f"out{t}" for t in range(n)),
                                  src_t=TL_DTYPES[dtype(match.inputs[roles[0]["table"]])],
                                  pick_out="\n".join(" " * 8 + p for p in pick),
                                  calls="\n".join(" " * 8 + c for c in _calls(name, kinds)))
    launcher = _GROUP_LAUNCHER.format(
        name=name, tables=[r["table"] for r in roles], idx=", ".join(_flat(match, r["idx"]) for r in roles),
        offsets=", ".join(_flat(match, r["offsets"]) for r in roles), include_last=int(bool(first.get("include_last"))),
        dtype=dtype(match.outputs[0]), n=n, BLOCK_D=block_d, BLOCK_L=block_l,
        num_warps=int(config.get("num_warps", 4)), num_stages=int(config.get("num_stages", 1)))
    return _ONE.format(name=name, body="\n".join("    " + b for b in body)) + kernel + launcher
