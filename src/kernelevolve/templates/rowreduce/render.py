"""Source for a row-reduction region: loads, the pointwise DAG, reductions and stores, persistent or looped."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from kernelevolve.analyze.graph import dtype, op_name, shape
from kernelevolve.analyze.pointwise import TL_DTYPES, expression
from kernelevolve.templates.base import HopelessConfig
from kernelevolve.templates.pointwise import load_type, broadcast_strides, contiguous_strides, merge_dims, offset_expr
from kernelevolve.templates.graphutil import pow2
from kernelevolve.templates.rowreduce.frame import MAX_TILE, REDUCTIONS, VIEWS, Frame, reduced_dim

# Tile values per thread past which a configuration is not rendered: Hopper has 255 registers a thread, and a tile of
# more spills to local memory, runs slowly and can take ptxas minutes to compile (a 16 x 4096 tile on one warp).
MAX_PER_THREAD = 128
# The one-read split form (ONE_READ) writes a share of a row back once about this many bytes were read after it: well
# inside an H100's or H200's 50 MB L2, so the share's second read comes from L2 rather than memory.
L2_SHARE = 16 << 20


class _Operand:
    """One pointer argument: an input read in one frame, or an output."""

    def __init__(self, var: str, full_strides: tuple[int, ...], d: int, size_d: int):
        self.var = var
        self.row_strides = full_strides[:d] + full_strides[d + 1:]
        self.col_stride = full_strides[d] if size_d > 1 else 0

    @property
    def rowdep(self) -> bool:
        return any(s != 0 for s in self.row_strides)


class RowGen:
    """``bound``: outside inputs whose values the kernel already holds (a GEMM's product tile, full-frame), by the
    variable holding them: they are read from there, not loaded."""

    def __init__(self, match: Any, frame: Frame, bound: dict[fx.Node, str] | None = None):
        self.m, self.f = match, frame
        self.bound = dict(bound or {})
        self.region = list(match.nodes)
        self.inside = set(self.region)
        self.sq = {n for n in self.region if n.name in set(match.spec["squeezed"])}
        self.loads: dict[tuple[fx.Node, bool], _Operand] = {}
        self.outs: list[_Operand] = []
        self.vec: dict[fx.Node, bool] = {}
        self._plan()

    def _operand(self, node: fx.Node, squeezed: bool) -> _Operand:
        key = (node, squeezed)
        if key not in self.loads:
            in_full = self.f.in_full(shape(node), squeezed)
            st = broadcast_strides(in_full, self.f.full)
            self.loads[key] = _Operand(f"in{len(self.loads)}", st, self.f.d, self.f.full[self.f.d])
        return self.loads[key]

    def _plan(self) -> None:
        for n in self.region:
            name = op_name(n)
            if reduced_dim(n) is not None or name == "gather":
                self.vec[n] = False
                args = [n.args[0]] if name != "gather" else [n.args[0], n.args[2]]
            elif name in VIEWS:  # a view is its source: a row scalar, or a vector where trailing unit dims change
                args = [n.args[0]]
            else:
                args = n.all_input_nodes
            flags = []
            for a in args:
                if a in self.inside:
                    flags.append(self.vec[a])
                elif a in self.bound:
                    flags.append(True)
                else:
                    op = self._operand(a, self.reads_squeezed(n))
                    flags.append(op.col_stride != 0)
            if n not in self.vec:
                self.vec[n] = any(flags)
        for k, o in enumerate(self.m.outputs):
            st = contiguous_strides(self.f.full if self.vec[o] else self.f.scal)
            self.outs.append(_Operand(f"out{k}", st, self.f.d, self.f.full[self.f.d]))

    def reads_squeezed(self, n: fx.Node) -> bool:
        """Whether ``n`` reads its outside inputs in the squeezed frame: a squeezed value, or a view of a
        squeezed-shape input up to a row scalar (``b.unsqueeze(-1)`` for b of shape F without d)."""
        if op_name(n) in VIEWS and self.f.sq != self.f.scal and n.args[0] not in self.inside \
                and shape(n.args[0]) == self.f.sq:
            return True
        return n in self.sq and reduced_dim(n) is None

    # ---- emission -------------------------------------------------------------------------------------------------

    def load(self, node: fx.Node, squeezed: bool, ind: str) -> str:
        op = self.loads[(node, squeezed)]
        col = "" if op.col_stride == 0 else ("cols" if op.col_stride == 1 else f"cols * {op.col_stride}")
        row = f"({offset_expr(self.row_sizes, op.row_merged, 'rows')})" if op.rowdep else ""
        off = " + ".join(x for x in (row, col) if x) or "0"
        mask = {(True, True): "mask", (True, False): "rmask", (False, True): "cmask", (False, False): None}[
            (op.rowdep, op.col_stride != 0)]
        ld = f"tl.load({op.var}_ptr + {off}" + (f", mask={mask}, other=0)" if mask else ")")
        return f"{ind}{op.var} = {ld}.to({load_type(node)})"

    def merge(self) -> None:
        ops = list(self.loads.values()) + self.outs
        sizes, merged = merge_dims(self.f.sq, [o.row_strides for o in ops])
        self.row_sizes = sizes
        for o, st in zip(ops, merged):
            o.row_merged = st

    def node(self, n: fx.Node, env: dict[fx.Node, str], ind: str, lines: list[str], acc: str | None = None) -> None:
        """One statement for ``n``; reductions fold into ``acc`` when given (looped schedule)."""
        name = op_name(n)
        var = f"v_{n.name}"
        if name in VIEWS:
            env[n] = env[n.args[0]]
            return
        red = reduced_dim(n) is not None or name == "gather"
        if red:
            src = env[n.args[0]]
            if name == "gather":
                val, neutral, fn = f"tl.where(mask & (cols == {env[n.args[2]]}), {src}, 0.0)", "0.0", "tl.sum"
            else:
                neutral = REDUCTIONS[name]
                fn = {"sum": "tl.sum", "amax": "tl.max", "amin": "tl.min"}[name]
                val = f"tl.where(mask, {src}, {neutral})"
            part = f"{fn}({val}, axis=1)[:, None]"
            if acc is None:
                lines.append(f"{ind}{var} = {part}")
            elif fn == "tl.sum":
                lines.append(f"{ind}{acc} = {acc} + {part}")
            else:
                lines.append(f"{ind}{acc} = {'tl.maximum' if fn == 'tl.max' else 'tl.minimum'}({acc}, {part})")
            if acc is None:
                env[n] = var
            return
        lines.append(f"{ind}{var} = {expression(n, env)}")
        env[n] = var

    def inputs_of(self, n: fx.Node) -> list[fx.Node]:
        name = op_name(n)
        if name in VIEWS or reduced_dim(n) is not None:
            return [n.args[0]]
        if name == "gather":
            return [n.args[0], n.args[2]]
        return list(n.all_input_nodes)

    def ensure(self, targets: list[fx.Node], env: dict[fx.Node, str], ind: str, lines: list[str],
               loaded: set[tuple[fx.Node, bool]]) -> None:
        """Emit every region ancestor of ``targets`` missing from ``env`` (loads included)."""
        need: list[fx.Node] = []
        seen: set[fx.Node] = set()

        def visit(n: fx.Node) -> None:
            if n in seen or n in env:
                return
            seen.add(n)
            for a in self.inputs_of(n):
                if a in self.inside:
                    visit(a)
            need.append(n)

        for t in targets:
            if t in self.inside:
                visit(t)
            elif t in self.bound:
                env[t] = self.bound[t]
            elif t not in env:
                key = (t, False)
                if key not in loaded:
                    lines.append(self.load(t, False, ind))
                    loaded.add(key)
                env[t] = self.loads[key].var
        for n in need:
            for a in self.inputs_of(n):
                if a in self.bound:
                    env[a] = self.bound[a]
                elif a not in self.inside:
                    key = (a, self.reads_squeezed(n))
                    if key not in loaded:
                        lines.append(self.load(a, key[1], ind))
                        loaded.add(key)
                    env[a] = self.loads[key].var
            self.node(n, env, ind, lines)


def render_region(match: Any, config: dict[str, Any], name: str, frame: Frame) -> str:
    g = RowGen(match, frame)
    g.merge()
    c = frame.full[frame.d]
    rows = 1
    for s in frame.sq:
        rows *= s
    block_r = max(1, min(int(config["BLOCK_R"]), pow2(rows)))
    persistent = bool(config["PERSISTENT"]) and pow2(c) <= MAX_TILE
    if persistent:
        block_c = pow2(c)
        block_r = max(1, min(block_r, MAX_TILE // block_c))
    else:
        block_c = max(16, min(int(config["BLOCK_C"]), pow2(c)))
    warps = int(config["num_warps"])
    if block_r * block_c > MAX_PER_THREAD * 32 * warps:
        raise HopelessConfig(f"a {block_r} x {block_c} tile on {warps} warp(s) holds "
                             f"{block_r * block_c // (32 * warps)} values per thread")
    parts = int(config.get("PARTS", 1)) if not persistent else 1
    if parts > 1:
        span = triton_cdiv(triton_cdiv(c, parts), block_c) * block_c
        if triton_cdiv(c, span) > 1:
            return _render_parts(g, match, config, name, c, rows, block_r, block_c, warps, span)
    split = int(config.get("SPLIT", 1)) if not persistent else 1
    span = triton_cdiv(triton_cdiv(c, split), block_c) * block_c
    split = triton_cdiv(c, span)
    lines = _body_persistent(g, c) if persistent else _body_looped(g, c, span if split > 1 else None)
    ptrs = [f"{o.var}_ptr" for o in g.loads.values()] + [f"{o.var}_ptr" for o in g.outs]
    alloc = "torch.zeros" if split > 1 else "torch.empty"
    outs = ", ".join(f"{alloc}({list(shape(n))!r}, dtype={dtype(n)}, device=_dev)" for n in match.outputs)
    ins = [g.loads[(a, sq)].var for (a, sq) in g.loads]
    args = {a: f"x{i}" for i, a in enumerate(match.inputs)}
    call = ", ".join(args[a] for (a, _sq) in g.loads)
    body = "\n".join(lines)
    wide = rows * c >= 2**31  # column offsets times strides may pass int32
    return f'''
@triton.jit
def {name}_kernel({", ".join(ptrs)}, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
    rmask = rows < {rows}
    cbase = tl.arange(0, BLOCK_C)[None, :]{".to(tl.int64)" if wide else ""}
{body}


def {name}({", ".join(args.values())}):
    _dev = x0.device
    {"; ".join(f"x{i} = x{i}.contiguous()" for i in range(len(args)))}
    outs = ({outs},)
    {name}_kernel[(_cdiv({rows}, {block_r}), {split})]({call}{", " if ins else ""}*outs, BLOCK_R={block_r}, BLOCK_C={block_c},
        num_warps={warps}, num_stages={int(config.get("num_stages", 1))})
    return outs
'''


def _render_parts(g: RowGen, match: Any, config: dict[str, Any], name: str, c: int, rows: int, block_r: int,
                  block_c: int, warps: int, span: int) -> str:
    """Each row shared by several programs (rowreduce/split.py): a kernel per reduction, then one for the outputs; or,
    with ONE_READ, one kernel that reads the row from memory once."""
    from kernelevolve.templates.rowreduce import split

    parts = triton_cdiv(c, span)
    reds = [n for n in g.region if reduced_dim(n) is not None or op_name(n) == "gather"]
    ptrs = [f"{o.var}_ptr" for o in g.loads.values()] + [f"{o.var}_ptr" for o in g.outs]
    helpers = {"online_partner": _online_partner, "gather_direct": _gather_direct,
               "scalar_ancestors": _scalar_ancestors, "fold": fold, "cross_lane": CROSS_LANE,
               "write_outputs": write_outputs}
    wide = rows * c >= 2**31
    outs = ", ".join(f"torch.empty({list(shape(n))!r}, dtype={dtype(n)}, device=_dev)" for n in match.outputs)
    args = {a: f"x{i}" for i, a in enumerate(match.inputs)}
    call = ", ".join(args[a] for (a, _sq) in g.loads)
    settings = f"BLOCK_R={block_r}, BLOCK_C={block_c}, num_warps={warps}, num_stages={int(config.get('num_stages', 1))}"
    blocks = triton_cdiv(rows, block_r)
    if config.get("ONE_READ"):
        # shares a program writes back, while those read since (about L2_SHARE bytes) leave them in L2
        share_bytes = block_r * span * max(t.itemsize for t in _load_dtypes(g))
        lag = min(blocks * parts, max(parts, L2_SHARE // share_bytes))
        source, slots = split.one_read(g, c, parts, span, reds, helpers, name, ptrs, rows, wide, blocks, lag)
        launches = (f"sync = torch.zeros({blocks + 1}, dtype=torch.int32, device=_dev)  # rows' counts, tickets\n"
                    f"    {name}_kernel[({blocks * parts + lag},)]({call}{', ' if call else ''}*outs, part, sync, "
                    f"{settings})")
        sources = [source]
    else:
        sources, slots = split.kernels(g, c, parts, span, reds, helpers, name, ptrs, rows, wide)
        launches = f"grid = ({blocks}, {parts})\n    " + "\n    ".join(
            f"{name}_part{k}_kernel[grid]({call}{', ' if call else ''}*outs, part, {settings})"
            for k in range(len(sources)))
    return "\n\n".join(sources) + f'''

def {name}({", ".join(args.values())}):
    _dev = x0.device
    {"; ".join(f"x{i} = x{i}.contiguous()" for i in range(len(args)))}
    outs = ({outs},)
    part = torch.empty({max(1, slots) * rows * parts}, dtype=torch.float32, device=_dev)  # each row's partials
    {launches}
    return outs
'''


def _load_dtypes(g: RowGen) -> list[torch.dtype]:
    """The dtypes of the region's loaded tensors (float32 where it loads none)."""
    return [a.meta["val"].dtype for (a, _sq) in g.loads if "val" in a.meta] or [torch.float32]


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def store_output(g: RowGen, k: int, n: fx.Node, env: dict[fx.Node, str], ind: str, scalar_mask: str = "rmask",
           write: str = "tl.store") -> str:
    """Output ``k``'s value ``n`` written by ``write`` (a store, or an atomic add of a partial sum)."""
    op = g.outs[k]
    row = f"({offset_expr(g.row_sizes, op.row_merged, 'rows')})"
    dt = TL_DTYPES[dtype(n)]
    if g.vec[n]:
        col = "cols" if op.col_stride == 1 else f"cols * {op.col_stride}"
        val = f"({env[n]} + tl.zeros([BLOCK_R, BLOCK_C], tl.float32))"
        return f"{ind}{write}({op.var}_ptr + {row} + {col}, {val}.to({dt}), mask=mask)"
    return (f"{ind}{write}({op.var}_ptr + {row}, ({env[n]} + tl.zeros([BLOCK_R, 1], tl.float32)).to({dt}), "
            f"mask={scalar_mask})")


def _body_persistent(g: RowGen, c: int) -> list[str]:
    ind = "    "
    lines = [f"{ind}cols = cbase", f"{ind}cmask = cols < {c}", f"{ind}mask = rmask & cmask"]
    env: dict[fx.Node, str] = {}
    g.ensure(list(g.m.outputs), env, ind, lines, set())
    lines += [store_output(g, k, n, env, ind) for k, n in enumerate(g.m.outputs)]
    return lines


def _body_looped(g: RowGen, c: int, span: int | None = None) -> list[str]:
    """One pass per reduction, except that amax followed by sum(exp(x - amax)) share one online pass (softmax,
    log-softmax, cross-entropy: two reads of the row instead of three) and a gather is a direct load of the target."""
    ind, inner = "    ", "        "
    env: dict[fx.Node, str] = {}
    lines: list[str] = []
    outer_loaded: set[tuple[fx.Node, bool]] = set()
    reds = [n for n in g.region if reduced_dim(n) is not None or op_name(n) == "gather"]
    chunk = [f"{ind}for c0 in range(0, {c}, BLOCK_C):", f"{inner}cols = c0 + cbase", f"{inner}cmask = cols < {c}",
             f"{inner}mask = rmask & cmask"]
    if span is not None:  # this program's share of the reduced dim; the partial sums meet in atomic adds
        lines += [f"{ind}c_lo = tl.program_id(1) * {span}", f"{ind}c_hi = tl.minimum(c_lo + {span}, {c})"]
        chunk[0] = f"{ind}for c0 in range(c_lo, c_hi, BLOCK_C):"
        chunk[2] = f"{inner}cmask = cols < c_hi"
    for r in reds:
        if r in env:
            continue
        g.ensure(_scalar_ancestors(g, r, env), env, ind, lines, outer_loaded)  # row scalars: once, outside the loop
        if op_name(r) == "gather":
            _gather_direct(g, r, env, ind, lines, outer_loaded, c)
            continue
        partner = _online_partner(g, r, reds, env)
        folded, values = fold(g, r, partner, env, chunk, outer_loaded)
        lines += folded
        if partner is not None:
            env[r], env[partner] = values
            continue
        lines.append(f"{ind}v_{r.name} = {values[0]}")
        env[r] = f"v_{r.name}"
    # a share of the reduced dim leaves partial sums, which meet in atomic adds
    return lines + write_outputs(g, env, chunk, outer_loaded, write="tl.atomic_add" if span is not None else "tl.store")


def write_outputs(g: RowGen, env: dict[fx.Node, str], chunk: list[str], loaded: set[tuple[fx.Node, bool]],
                  scalar_mask: str = "rmask", write: str = "tl.store") -> list[str]:
    """The outputs once the reductions are in ``env``: the vector ones in a loop over ``chunk``, then the row
    scalars, stored where ``scalar_mask`` holds; each written by ``write``."""
    ind, inner = "    ", "        "
    lines: list[str] = []
    scal_outs = [o for o in g.m.outputs if not g.vec[o]]
    vec_outs = [o for o in g.m.outputs if g.vec[o]]
    g.ensure(scal_outs + [a for o in vec_outs for a in _scalar_ancestors(g, o, env)], env, ind, lines, loaded)
    if vec_outs:
        lines += chunk
        local = dict(env)
        g.ensure(vec_outs, local, inner, lines, set(loaded))
        lines += [store_output(g, k, n, local, inner, write=write) for k, n in enumerate(g.m.outputs) if g.vec[n]]
    return lines + [store_output(g, k, n, env, ind, scalar_mask, write) for k, n in enumerate(g.m.outputs) if not g.vec[n]]


CROSS_LANE = {"sum": "tl.sum", "amax": "tl.max", "amin": "tl.min"}


def fold(g: RowGen, r: fx.Node, partner: fx.Node | None, env: dict[fx.Node, str], chunk: list[str],
         loaded: set[tuple[fx.Node, bool]]) -> tuple[list[str], list[str]]:
    """The loop over ``chunk`` that reduces ``r`` (with its online ``partner``, the running max and sum of
    exponentials, where it has one) and the row values it leaves: [max, sum] for a pair, else the one reduction."""
    ind, inner = "    ", "        "
    local = dict(env)
    if partner is not None:
        src = r.args[0]
        m, s_ = f"acc_{r.name}", f"acc_{partner.name}"
        lines = [f"{ind}{m} = tl.full([BLOCK_R, 1], float('-inf'), tl.float32)",
                 f"{ind}{s_} = tl.zeros([BLOCK_R, 1], tl.float32)"] + chunk
        g.ensure([src], local, inner, lines, set(loaded))
        a = local[src]
        lines += [f"{inner}m_new = tl.maximum({m}, tl.max(tl.where(mask, {a}, float('-inf')), axis=1)[:, None])",
                  f"{inner}m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)",
                  f"{inner}{s_} = {s_} * tl.exp({m} - m_safe) + "
                  f"tl.sum(tl.where(mask, tl.exp({a} - m_safe), 0.0), axis=1)[:, None]",
                  f"{inner}{m} = m_new"]
        return lines, [m, s_]
    # a tile accumulator: elementwise folds in the loop, one cross-lane reduction after it
    name = op_name(r)
    neutral = REDUCTIONS[name]
    step = {"sum": "{a} + {v}", "amax": "tl.maximum({a}, {v})", "amin": "tl.minimum({a}, {v})"}[name]
    acc = f"acc_{r.name}"
    lines = [f"{ind}{acc} = tl.full([BLOCK_R, BLOCK_C], {neutral}, tl.float32)"] + chunk
    g.ensure(g.inputs_of(r), local, inner, lines, set(loaded))
    lines.append(f"{inner}{acc} = " + step.format(a=acc, v=f"tl.where(mask, {local[r.args[0]]}, {neutral})"))
    return lines, [f"{CROSS_LANE[name]}({acc}, axis=1)[:, None]"]


def _online_partner(g: RowGen, r: fx.Node, reds: list[fx.Node], env: dict[fx.Node, str]) -> fx.Node | None:
    """The sum(exp(x - r)) that can share r's pass, when r = amax(x) and that sum needs no other row scalar."""
    if op_name(r) != "amax":
        return None
    src = r.args[0]
    for s in reds:
        e = s.args[0] if op_name(s) == "sum" else None
        if e is None or op_name(e) != "exp" or e not in g.inside:
            continue
        sub = e.args[0]
        if (isinstance(sub, fx.Node) and op_name(sub) == "sub" and sub in g.inside and sub.args[0] is src
                and sub.args[1] is r and not sub.kwargs.get("alpha")
                and not _scalar_ancestors(g, s, {**env, r: "m"})):
            return s
    return None


def _gather_direct(g: RowGen, r: fx.Node, env: dict[fx.Node, str], ind: str, lines: list[str],
                   loaded: set[tuple[fx.Node, bool]], c: int) -> None:
    """gather(f(x, row scalars), idx) along the row is f(x[idx], row scalars): load the picked elements directly."""
    src, idx = r.args[0], r.args[2]
    g.ensure([idx], env, ind, lines, loaded)
    iv = env[idx]
    chain: list[fx.Node] = []
    seen: set[fx.Node] = set()

    def visit(n: fx.Node) -> None:
        if n in seen or n not in g.inside or not g.vec[n]:
            return
        seen.add(n)
        for a in g.inputs_of(n):
            visit(a)
        chain.append(n)

    visit(src)
    genv = dict(env)
    pick = f"rmask & ({iv} >= 0) & ({iv} < {c})"
    for n in chain or [src]:
        for a in (g.inputs_of(n) if n in g.inside else [n]):
            if a in g.inside or a in genv:
                continue
            key = (a, g.reads_squeezed(n) if n in g.inside else False)
            op = g.loads[key]
            if op.col_stride == 0:
                if key not in loaded:
                    lines.append(g.load(a, key[1], ind))
                    loaded.add(key)
                genv[a] = op.var
                continue
            row = f"({offset_expr(g.row_sizes, op.row_merged, 'rows')}) + " if op.rowdep else ""
            col = iv if op.col_stride == 1 else f"{iv} * {op.col_stride}"
            var = f"{op.var}_at_{r.name}"
            lines.append(f"{ind}{var} = tl.load({op.var}_ptr + {row}{col}, mask={pick}, other=0).to(tl.float32)")
            genv[a] = var
    for n in chain:
        var = f"g_{r.name}_{n.name}"
        lines.append(f"{ind}{var} = {expression(n, genv)}")
        genv[n] = var
    env[r] = genv[src]


def _scalar_ancestors(g: RowGen, n: fx.Node, env: dict[fx.Node, str]) -> list[fx.Node]:
    """Row-scalar region nodes that ``n``'s vector work reads and that can be computed outside the chunk loop."""
    out: list[fx.Node] = []
    seen: set[fx.Node] = set()

    def visit(x: fx.Node) -> None:
        if x in seen or x in env:
            return
        seen.add(x)
        if not g.vec[x] and (reduced_dim(x) is None and op_name(x) != "gather") and x is not n:
            out.append(x)
            return
        if x is n or g.vec[x]:
            for a in g.inputs_of(x):
                if a in g.inside:
                    visit(a)

    visit(n)
    return out
