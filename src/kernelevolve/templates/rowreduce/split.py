"""Rows split across programs: PARTS programs share each row, for rows too wide for one program to hold or to fill
the GPU with (softmax over 400k values, a few hundred rows). Each reduction of the region is a stage: a kernel whose
programs reduce their share of the row and write a partial; the next stage's programs (and the last kernel's) read
all partials of their rows and combine them (sums add, maxima take the max, a softmax's online pair of max and
sum of exponentials merges by rescaling). The last kernel writes the outputs, each program its share of the row.
A region with k reductions takes k + 1 launches and reads the row k + 1 times (an online pair counts once)."""
from __future__ import annotations

from typing import Any

import torch.fx as fx

from kernelevolve.analyze.graph import op_name
from kernelevolve.analyze.pointwise import CodegenError
from kernelevolve.templates.graphutil import pow2
from kernelevolve.templates.rowreduce.frame import REDUCTIONS, reduced_dim

COMBINE = {"sum": "tl.sum", "amax": "tl.max", "amin": "tl.min"}


def stages(g: Any, reds: list[fx.Node], online_partner: Any) -> list[tuple[fx.Node, fx.Node | None]]:
    """The reductions in order, each with its online partner (the sum of exp(x - max) that shares a max's pass)."""
    out, env, taken = [], {}, set()
    for r in reds:
        if r in taken or op_name(r) == "gather":
            continue
        partner = online_partner(g, r, reds, env)
        out.append((r, partner))
        taken.add(r)
        env[r] = "m"
        if partner is not None:
            taken.add(partner)
            env[partner] = "s"
    return out


def kernels(g: Any, c: int, parts: int, span: int, reds: list[fx.Node], helpers: dict[str, Any],
            name: str, ptrs: list[str], rows: int, wide: bool) -> tuple[list[str], int]:
    """The source of every kernel (the stages', then the last one) and the number of partial slots."""
    order = stages(g, reds, helpers["online_partner"])
    slots: dict[fx.Node, int] = {}
    for r, partner in order:
        slots[r] = len(slots)
        if partner is not None:
            slots[partner] = len(slots)
    p2 = pow2(parts)
    head = ["    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]",
            f"    rmask = rows < {rows}",
            f"    cbase = tl.arange(0, BLOCK_C)[None, :]{'.to(tl.int64)' if wide else ''}",
            f"    c_lo = tl.program_id(1) * {span}",
            f"    c_hi = tl.minimum(c_lo + {span}, {c})",
            f"    sidx = tl.arange(0, {p2})[None, :]",
            f"    smask = rmask & (sidx < {parts})"]
    chunk = ["    for c0 in range(c_lo, c_hi, BLOCK_C):", "        cols = c0 + cbase", "        cmask = cols < c_hi",
             "        mask = rmask & cmask"]
    sources = []
    signature = ", ".join(ptrs + ["part_ptr", "BLOCK_R: tl.constexpr", "BLOCK_C: tl.constexpr"])
    for k in range(len(order) + 1):
        env: dict[fx.Node, str] = {}
        lines = list(head)
        loaded: set = set()
        for r, partner in order[:k]:  # earlier stages: their partials, combined
            _combine(r, partner, slots, rows, parts, env, lines)
        for r in reds:  # a picked element (cross-entropy's target) where the row scalars it reads are at hand
            if op_name(r) == "gather" and r not in env and all(a in env for a in _reductions_under(g, r)):
                tried_env, tried_lines, tried_loaded = dict(env), [], set(loaded)
                try:
                    g.ensure(helpers["scalar_ancestors"](g, r, tried_env), tried_env, "    ", tried_lines, tried_loaded)
                    helpers["gather_direct"](g, r, tried_env, "    ", tried_lines, tried_loaded, c)
                except CodegenError:  # it reads a later stage's reduction: a later kernel picks it
                    continue
                env.update(tried_env)
                lines += tried_lines
                loaded |= tried_loaded
        if k < len(order):
            r, partner = order[k]
            lines += _partial(g, r, partner, slots, rows, parts, env, chunk, loaded, helpers)
        else:
            lines += _outputs(g, env, chunk, loaded, helpers)
        sources.append(f"@triton.jit\ndef {name}_part{k}_kernel({signature}):\n" + "\n".join(lines) + "\n")
    return sources, len(slots)


def _reductions_under(g: Any, n: fx.Node) -> set[fx.Node]:
    """The region's reductions that ``n`` reads, directly or through other nodes."""
    out: set[fx.Node] = set()
    seen: set[fx.Node] = set()
    todo = [a for a in g.inputs_of(n) if a in g.inside]
    while todo:
        a = todo.pop()
        if a in seen:
            continue
        seen.add(a)
        if reduced_dim(a) is not None or op_name(a) == "gather":
            out.add(a)
        todo += [b for b in g.inputs_of(a) if b in g.inside]
    return out


def _slot(slot: int, rows: int, parts: int) -> str:
    return f"part_ptr + ({slot} * {rows} + rows) * {parts}"


def _combine(r: fx.Node, partner: fx.Node | None, slots: dict[fx.Node, int], rows: int, parts: int,
             env: dict[fx.Node, str], lines: list[str]) -> None:
    if partner is not None:
        m, s = f"m_{r.name}", f"s_{partner.name}"
        lines += [f"    {m}_p = tl.load({_slot(slots[r], rows, parts)} + sidx, mask=smask, other=float('-inf'))",
                  f"    {s}_p = tl.load({_slot(slots[partner], rows, parts)} + sidx, mask=smask, other=0.0)",
                  f"    {m} = tl.max({m}_p, axis=1)[:, None]",
                  f"    {m}_safe = tl.where({m} == float('-inf'), 0.0, {m})",
                  f"    {s} = tl.sum({s}_p * tl.exp({m}_p - {m}_safe), axis=1)[:, None]"]
        env[r], env[partner] = m, s
        return
    var = f"v_{r.name}"
    neutral = REDUCTIONS[op_name(r)]
    lines += [f"    {var}_p = tl.load({_slot(slots[r], rows, parts)} + sidx, mask=smask, other={neutral})",
              f"    {var} = {COMBINE[op_name(r)]}({var}_p, axis=1)[:, None]"]
    env[r] = var


def _partial(g: Any, r: fx.Node, partner: fx.Node | None, slots: dict[fx.Node, int], rows: int, parts: int,
             env: dict[fx.Node, str], chunk: list[str], loaded: set, helpers: dict[str, Any]) -> list[str]:
    """This program's partial of stage ``r`` over its share of the row, stored in its slot."""
    ind, inner = "    ", "        "
    lines: list[str] = []
    g.ensure(helpers["scalar_ancestors"](g, r, env), env, ind, lines, loaded)
    local = dict(env)
    where = f"{_slot(slots[r], rows, parts)} + tl.program_id(1)"
    if partner is not None:
        src = r.args[0]
        m, s = f"acc_{r.name}", f"acc_{partner.name}"
        lines += [f"{ind}{m} = tl.full([BLOCK_R, 1], float('-inf'), tl.float32)",
                  f"{ind}{s} = tl.zeros([BLOCK_R, 1], tl.float32)"] + chunk
        g.ensure([src], local, inner, lines, set(loaded))
        a = local[src]
        lines += [f"{inner}m_new = tl.maximum({m}, tl.max(tl.where(mask, {a}, float('-inf')), axis=1)[:, None])",
                  f"{inner}m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)",
                  f"{inner}{s} = {s} * tl.exp({m} - m_safe) + "
                  f"tl.sum(tl.where(mask, tl.exp({a} - m_safe), 0.0), axis=1)[:, None]",
                  f"{inner}{m} = m_new",
                  f"{ind}tl.store({where}, {m}, mask=rmask)",
                  f"{ind}tl.store({_slot(slots[partner], rows, parts)} + tl.program_id(1), {s}, mask=rmask)"]
        return lines
    name = op_name(r)
    neutral = REDUCTIONS[name]
    fold = {"sum": "{a} + {v}", "amax": "tl.maximum({a}, {v})", "amin": "tl.minimum({a}, {v})"}[name]
    acc = f"acc_{r.name}"
    lines.append(f"{ind}{acc} = tl.full([BLOCK_R, BLOCK_C], {neutral}, tl.float32)")
    lines += chunk
    g.ensure(g.inputs_of(r), local, inner, lines, set(loaded))
    lines.append(f"{inner}{acc} = " + fold.format(a=acc, v=f"tl.where(mask, {local[r.args[0]]}, {neutral})"))
    lines.append(f"{ind}tl.store({where}, {COMBINE[name]}({acc}, axis=1)[:, None], mask=rmask)")
    return lines


def _outputs(g: Any, env: dict[fx.Node, str], chunk: list[str], loaded: set, helpers: dict[str, Any]) -> list[str]:
    """The last kernel: row-scalar outputs (by the first program of each row) and this program's share of the
    vector outputs."""
    ind, inner = "    ", "        "
    lines: list[str] = []
    store = helpers["store"]
    scal = [o for o in g.m.outputs if not g.vec[o]]
    vec = [o for o in g.m.outputs if g.vec[o]]
    g.ensure(scal + [a for o in vec for a in helpers["scalar_ancestors"](g, o, env)], env, ind, lines, loaded)
    if vec:
        lines += chunk
        local = dict(env)
        g.ensure(vec, local, inner, lines, set(loaded))
        lines += [store(g, k, n, local, inner) for k, n in enumerate(g.m.outputs) if g.vec[n]]
    first = "mask=rmask & (rows * 0 + c_lo == 0))"  # a block mask: Triton's interpreter takes no scalar in one
    lines += [store(g, k, n, env, ind).replace("mask=rmask)", first)
              for k, n in enumerate(g.m.outputs) if not g.vec[n]]
    return lines
