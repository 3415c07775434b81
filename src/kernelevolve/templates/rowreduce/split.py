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
            _combine(r, partner, slots, rows, parts, env, lines, helpers["cross_lane"])
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
            # the row scalars by the first program of each row (a block mask: the interpreter takes no scalar in one)
            lines += helpers["write_outputs"](g, env, chunk, loaded, "rmask & (rows * 0 + c_lo == 0)")
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
             env: dict[fx.Node, str], lines: list[str], cross_lane: dict[str, str]) -> None:
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
              f"    {var} = {cross_lane[op_name(r)]}({var}_p, axis=1)[:, None]"]
    env[r] = var


def _partial(g: Any, r: fx.Node, partner: fx.Node | None, slots: dict[fx.Node, int], rows: int, parts: int,
             env: dict[fx.Node, str], chunk: list[str], loaded: set, helpers: dict[str, Any]) -> list[str]:
    """This program's partial of stage ``r`` over its share of the row, stored in its slot (codegen.fold's loop)."""
    lines: list[str] = []
    g.ensure(helpers["scalar_ancestors"](g, r, env), env, "    ", lines, loaded)
    folded, values = helpers["fold"](g, r, partner, env, chunk, loaded)
    lines += folded
    for node, value in zip((r, partner), values):
        lines.append(f"    tl.store({_slot(slots[node], rows, parts)} + tl.program_id(1), {value}, mask=rmask)")
    return lines
