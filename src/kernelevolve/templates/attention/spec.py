"""What the kernel is rendered from: the mask band probed at capture, and the score and operand code of a region."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from kernelevolve.analyze import pointwise
from kernelevolve.analyze.graph import CapturedGraph, dtype, op_name, shape, tensor_args, topo_index
from kernelevolve.templates.attention.region import REPLAY_OPS, in_map, NoMatch, Region, softmax_scale
from kernelevolve.templates.base import Match
from kernelevolve.templates.graphutil import CASTS, DIM_OPS, RESHAPES, SAME

HALF = (torch.float16, torch.bfloat16)
PROBE_LIMIT = 1 << 24  # score positions probed at capture; beyond it every mask term stays and no block is skipped


# ---- probing the mask at capture ---------------------------------------------------------------------------------


def _known(graph: CapturedGraph, node: fx.Node) -> torch.Tensor | None:
    """The value of mask-like module state (and views of it). Only all-0/1/inf tensors, such as a ``tril`` buffer,
    are trusted: the evaluator rebuilds the module with another seed, which changes any random parameter."""
    if node.op == "placeholder":
        idx = graph.placeholders().index(node)
        v = graph.state[idx] if idx < len(graph.state_names) else None
        return v if v is not None and bool(((v == 0) | (v == 1) | v.isinf()).all()) else None
    if node.op == "call_function" and op_name(node) in REPLAY_OPS and len(tensor_args(node)) == 1:
        base = _known(graph, node.args[0])
        return None if base is None else node.target(base, *node.args[1:], **node.kwargs)
    return None


def _evaluate(reg: Region, values: dict[fx.Node, Any], probe: torch.Tensor) -> dict[fx.Node, Any]:
    vals = dict(values)
    vals[reg.s_node] = probe
    order = topo_index(reg.pv.graph)
    for n in sorted([*reg.side, *reg.main], key=order.__getitem__):
        if any(vals.get(a) is None for a in tensor_args(n)):
            vals[n] = None
            continue
        args, kwargs = torch.utils._pytree.tree_map(lambda a: vals[a] if isinstance(a, fx.Node) else a,
                                                    (n.args, n.kwargs))
        vals[n] = n.target(*args, **kwargs)
    return vals


def probe_spec(graph: CapturedGraph, reg: Region, s_shape: list[int], qdim: int | None,
           kdim: int) -> tuple[list[int | None], dict[fx.Node, Any]]:
    """The band [lo, hi] of ``j - i`` outside which weights are zero whatever the scores, and the boundary values
    that are constant inside it. Scores are probed with random fills; masks come from indices and module state."""
    band: list[int | None] = [None, None]
    m, n = s_shape[qdim] if qdim is not None else 1, s_shape[kdim]
    known = {leaf: _known(graph, leaf) for leaf in reg.leaves}
    if m * n > PROBE_LIMIT or any(v is not None and v.numel() > PROBE_LIMIT for v in known.values()):
        return band, {}
    rank = len(s_shape)
    frame = [1] * rank
    frame[kdim] = n
    if qdim is not None:
        frame[qdim] = m
    gen = torch.Generator().manual_seed(0)
    fills = [torch.randn(frame, generator=gen) * 4, torch.randn(frame, generator=gen) + 8,
             -torch.rand(frame, generator=gen) * 8 - 1]
    runs = [_evaluate(reg, known, f.to(dtype(reg.s_node))) for f in fills]
    i = torch.arange(m).view([m if d == qdim else 1 for d in range(rank)])
    j = torch.arange(n).view([n if d == kdim else 1 for d in range(rank)])
    if runs[0][reg.x] is not None and qdim is not None:
        empty = torch.stack([(r[reg.x] == float("-inf")) if reg.mode == "softmax" else (r[reg.x] == 0) for r in runs])
        live = torch.broadcast_to(~empty.all(0), torch.broadcast_shapes(empty.shape[1:], tuple(frame)))
        live = live.movedim((qdim, kdim), (-2, -1)).reshape(-1, m, n).any(0)
        if live.any():
            d = (torch.arange(n)[None, :] - torch.arange(m)[:, None])[live]
            lo, hi = int(d.min()), int(d.max())
            band = [lo if lo > 1 - m else None, hi if hi < n - 1 else None]
    inband = torch.ones(frame, dtype=torch.bool)
    if band[0] is not None:
        inband &= (j - i) >= band[0]
    if band[1] is not None:
        inband &= (j - i) <= band[1]
    consts = {}
    for b in {a for u in reg.main for a in tensor_args(u) if a not in reg.main and a is not reg.s_node}:
        v = runs[0].get(b)
        if isinstance(v, torch.Tensor):
            full = torch.broadcast_shapes(v.shape, inband.shape)
            sel = torch.broadcast_to(v, full)[torch.broadcast_to(inband, full)]
            if sel.numel() and bool((sel == sel[0]).all()):
                consts[b] = sel[0].item()
    return band, consts


# ---- code generation ---------------------------------------------------------------------------------------------


def _literal(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float) and (v != v or abs(v) == float("inf")):
        return "float('nan')" if v != v else f"float('{'-' if v < 0 else ''}inf')"
    return repr(v)


def _fold(n: fx.Node, cv: dict[fx.Node, Any]) -> Any:
    """The argument ``n`` reduces to once its constant operands are known (where/masked_fill/+0/*1), else None."""
    name, a = op_name(n), n.args

    def c(i: int) -> Any:
        return cv.get(a[i]) if isinstance(a[i], fx.Node) else a[i]

    if name == "where" and c(0) is not None:
        return a[1] if c(0) else a[2]
    if name == "masked_fill" and c(1) is not None:
        return a[2] if c(1) else a[0]
    if n.kwargs or len(a) != 2:
        return None
    if (name in ("add", "sub") and c(1) == 0) or (name in ("mul", "div") and c(1) == 1):
        return a[0]
    if (name == "add" and c(0) == 0) or (name == "mul" and c(0) == 1):
        return a[1]
    return None


def _reciprocal(n: fx.Node, env: dict[fx.Node, str]) -> str | None:
    """``x / c`` as ``x * (1 / c)``: a multiply instead of an fp32 division per score (within an ulp)."""
    if op_name(n) != "div" or n.kwargs or not isinstance(n.args[0], fx.Node) or n.args[0] not in env:
        return None
    c = n.args[1]
    ok = isinstance(c, (int, float)) and not isinstance(c, bool) and c != 0 and abs(c) != float("inf")
    return f"({env[n.args[0]]} * {1.0 / c!r})" if ok else None


def _score_code(reg: Region, env0: dict[fx.Node, str], consts: dict[fx.Node, Any],
                prefix: str) -> tuple[list[str], str]:
    """Triton statements computing ``reg.x`` from ``s`` (the scaled scores), indices and loaded leaves."""
    env, cv, lines = dict(env0), dict(consts), []
    for node, v in consts.items():
        env[node] = _literal(v)
    needed, stack = set(), [reg.x]
    while stack:
        n = stack.pop()
        if n not in env and n not in needed:
            needed.add(n)
            stack.extend(tensor_args(n))
    order = topo_index(reg.pv.graph)
    for k, n in enumerate(sorted(needed, key=order.__getitem__)):
        name = op_name(n)
        if name == "full":
            cv[n] = n.args[1]
            env[n] = _literal(cv[n])
        elif name in DIM_OPS and not pointwise.is_pointwise(n):
            env[n] = env[n.args[0]]
            if n.args[0] in cv:
                cv[n] = cv[n.args[0]]
        elif name == "scalar_tensor":
            cv[n] = n.args[0]
            env[n] = _literal(cv[n])
        else:
            to = _fold(n, cv)
            if to is None:
                expr = _reciprocal(n, env) or pointwise.expression(n, env)
                if not expr.isidentifier():  # identity casts just rename
                    lines.append(f"{prefix}{k} = {expr}")
                    expr = f"{prefix}{k}"
                env[n] = expr
            elif isinstance(to, fx.Node):
                env[n] = env[to]
                if to in cv:
                    cv[n] = cv[to]
            else:
                env[n], cv[n] = _literal(to), to
    return lines, env[reg.x]


def _index_env(reg: Region, dm: dict[fx.Node, list[int | None]], qdim: int | None, kdim: int) -> dict[fx.Node, str]:
    """``arange`` values as expressions of the query/key offsets: on the arange itself, or on each view of it when
    the views read it along different axes."""
    env = {}
    inner = set(reg.main) | set(reg.side)
    for n in reg.side:
        if op_name(n) != "arange":
            continue
        a, ov = n.args, n.target._overloadname
        start, step = (0, 1) if ov == "default" else (a[0], a[2] if len(a) > 2 else 1)
        if not all(isinstance(v, int) for v in (start, step)):
            raise NoMatch("non-integer arange")
        dt = n.kwargs.get("dtype")
        cast = ".to(tl.float32)" if dt is not None and dt.is_floating_point else ""
        direct = set()
        for u in (u for u in n.users if u in inner):
            (d,) = in_map(u, n, dm[u])
            if d is None:
                expr = str(start)
            elif d in (qdim, kdim):
                expr = f"({'offs_m[:, None]' if d == qdim else 'offs_n[None, :]'} * {step} + {start}){cast}"
            else:
                raise NoMatch("an index mask over a batch dim")
            if op_name(u) in DIM_OPS and not pointwise.is_pointwise(u):
                env[u] = expr
            else:
                direct.add(expr)
        if len(direct) > 1:
            raise NoMatch("an arange read along two axes by elementwise ops")
        if direct:
            env[n] = direct.pop()
    return env


def _simple(chain: list[fx.Node], scales: bool) -> bool:
    """Only casts (and, if ``scales``, multiplies by constants) between the source and the operand."""
    pw = [n for n in chain[1:] if op_name(n) not in REPLAY_OPS]
    return all(op_name(n) in CASTS or (scales and softmax_scale(n)) for n in pw)


def _dot_dtypes(reg: Region, end: fx.Node) -> tuple[torch.dtype, torch.dtype]:
    """The dtypes the two dots run in. Half sources upcast only for the math (SDPA on the CPU) keep the half dot:
    q.k products are exact in fp32 either way; p is rounded to v's half type, as flash attention does, when the
    output is half too."""
    q, k, v = reg.chains["q"], reg.chains["k"], reg.chains["v"]
    qk, pv = dtype(reg.qk), dtype(reg.pv)
    if qk == torch.float32 and dtype(q[0]) == dtype(k[0]) in HALF and _simple(q, True) and _simple(k, True):
        qk = dtype(q[0])
    if pv == torch.float32 and dtype(v[0]) in HALF and dtype(end) in HALF and _simple(v, False):
        pv = dtype(v[0])
    return qk, pv


def _operand_code(role: str, chain: list[fx.Node], to: torch.dtype, fold: bool) -> tuple[list[str], float]:
    """Statements turning the loaded tile ``role`` into the dot operand, and the scale folded into the scores."""
    src, pw = chain[0], [n for n in chain[1:] if op_name(n) not in REPLAY_OPS]
    if _simple(chain, fold):
        factor = 1.0
        for n in pw:
            factor *= softmax_scale(n) or 1.0
        return ([f"{role} = {role}.to({pointwise.TL_DTYPES[to]})"] if dtype(src) != to else []), factor
    lines = [f"{role}_x = {role}.to(tl.float32)"]
    env = pointwise.emit(pw, {src: f"{role}_x"}, lines, prefix=f"{role}_p")
    lines.append(f"{role} = {env[pw[-1]]}.to({pointwise.TL_DTYPES[to]})")
    return lines, 1.0


def _identity(n: fx.Node) -> bool:
    """An expand to its input's own shape: a view the launcher need not make on every call."""
    src = n.args[0] if n.args else None
    if op_name(n) != "expand" or not isinstance(src, fx.Node) or "val" not in src.meta or "val" not in n.meta:
        return False
    return tuple(src.meta["val"].shape) == tuple(n.meta["val"].shape)


def _replay(var: str, chain: list[fx.Node]) -> list[str]:
    """Launcher lines redoing the chain's views on the runtime source (trailing reshapes are read by strides)."""
    ops = [n for n in chain[1:] if op_name(n) in REPLAY_OPS and op_name(n) not in SAME and not _identity(n)]
    while ops and op_name(ops[-1]) in RESHAPES:
        ops.pop()
    lines = []
    for n in ops:
        target = "aten.reshape.default" if op_name(n) in RESHAPES else str(n.target)
        args = "".join(f", {a!r}" for a in n.args[1:])
        lines.append(f"{var} = torch.ops.{target}({var}{args})")
    return lines


def _aux_spec(dmap: list[int | None], index: int, s_shape: list[int], qdim: int | None, kdim: int,
              zorder: list[int]) -> dict[str, Any]:
    """How the launcher views a leaf as [z, m, n] (its dim feeding each score dim) and the tile the kernel loads."""
    src = {d: i for i, d in enumerate(dmap) if d is not None}
    perm = [*zorder, qdim, kdim]
    rows, cols = qdim is not None and qdim in src, kdim in src
    kind = {(True, True): "tile", (True, False): "row", (False, True): "col", (False, False): "scalar"}[rows, cols]
    return {"input": index, "sizes": [s_shape[d] if d is not None else 1 for d in perm],
            "dims": [src.get(d) if d is not None else None for d in perm], "kind": kind}


def spec_of(reg: Region, match: Match, dims: tuple, dm: dict[fx.Node, list[int | None]], band: list[int | None],
          consts: dict[fx.Node, Any], out_layout: tuple) -> dict[str, Any]:
    s_shape, _, qdim, kdim, zorder = dims
    idx = {node: i for i, node in enumerate(match.inputs)}
    end = reg.out[-1] if reg.out else reg.pv
    qk, pv = _dot_dtypes(reg, end)
    scale, operands = 1.0, {}
    for role in ("q", "k", "v"):
        chain = reg.chains[role]
        code, factor = _operand_code(role, chain, qk if role != "v" else pv, fold=role != "v")
        scale *= factor
        operands[role] = {"input": idx[chain[0]], "replay": _replay(role, chain), "code": code}
    env0 = {reg.s_node: "s"}
    cur = reg.s_node
    while len(cur.users) == 1 and next(iter(cur.users)) in reg.main and softmax_scale(next(iter(cur.users))):
        cur = next(iter(cur.users))
        scale *= softmax_scale(cur)
        env0[cur] = "s"
    env0.update(_index_env(reg, dm, qdim, kdim))
    aux = []
    for i, leaf in enumerate(reg.leaves):
        env0[leaf] = f"a{i}"
        aux.append(_aux_spec(dm[leaf], idx[leaf], s_shape, qdim, kdim, zorder))
    z, m, n = shape(reg.qk)
    return {"mode": reg.mode, "zero_empty": reg.zero_empty, "band": band, "scale": scale,
            "sizes": [z, m, n, shape(reg.qk.args[0])[2], shape(reg.pv)[2]],
            "qk_dtype": pointwise.TL_DTYPES[qk], "pv_dtype": pointwise.TL_DTYPES[pv],
            "operands": operands, "aux": aux,
            "score": {"full": _score_code(reg, env0, {}, "sf"), "interior": _score_code(reg, env0, consts, "si")},
            "out": {"shape": list(shape(end)), "dtype": str(dtype(end)), "layout": list(out_layout)}}

