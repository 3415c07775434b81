"""Rows split across programs: PARTS programs share each row, for rows too wide for one program to hold or to fill
the GPU with (softmax over 400k values, a few hundred rows). Each reduction of the region is a stage: a kernel whose
programs reduce their share of the row and write a partial; the next stage's programs (and the last kernel's) read
all partials of their rows and combine them (sums add, maxima take the max, a softmax's online pair of max and
sum of exponentials merges by rescaling). The last kernel writes the outputs, each program its share of the row.
A region with k reductions takes k + 1 launches and reads the row k + 1 times (an online pair counts once).

The one-read form (ONE_READ, ``one_read``) is one kernel for regions whose reductions read no other reduction: each
program reduces one share and later writes the outputs of a share read shortly before it, whose partials are all in
by then; that share is still in L2, so memory sees each row read once and written once."""
from __future__ import annotations

from typing import Any

import torch.fx as fx

from kernelevolve.analyze.graph import op_name
from kernelevolve.analyze.pointwise import CodegenError
from kernelevolve.templates.base import HopelessConfig
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
    order, slots = _slots(g, reds, helpers)
    signature = ", ".join(ptrs + ["part_ptr", "BLOCK_R: tl.constexpr", "BLOCK_C: tl.constexpr"])
    pids = ("tl.program_id(0)", "tl.program_id(1)")
    sources = []
    for k in range(len(order) + 1):
        lines = _head(c, parts, span, rows, wide, pids)
        env: dict[fx.Node, str] = {}
        loaded: set = set()
        _combined(g, order[:k], slots, rows, parts, reds, env, lines, loaded, helpers, c)
        if k < len(order):
            r, partner = order[k]
            lines += _partial(g, r, partner, slots, rows, parts, env, CHUNK, loaded, helpers, pids[1])
        else:
            # the row scalars by the first program of each row (a block mask: the interpreter takes no scalar in one)
            lines += helpers["write_outputs"](g, env, CHUNK, loaded, "rmask & (rows * 0 + c_lo == 0)")
        sources.append(f"@triton.jit\ndef {name}_part{k}_kernel({signature}):\n" + "\n".join(lines) + "\n")
    return sources, len(slots)


def one_read(g: Any, c: int, parts: int, span: int, reds: list[fx.Node], helpers: dict[str, Any], name: str,
             ptrs: list[str], rows: int, wide: bool, blocks: int, lag: int) -> tuple[str, int]:
    """One kernel that reads the row once from memory: program ``k`` (by the order programs start in, a ticket)
    reduces share ``k`` into its partials, then writes the outputs of share ``k - lag`` once every partial of that
    share's rows is in. ``lag`` shares back, that share was read a moment ago and is still in L2, so memory sees one
    read and one write of each row. A program only waits on programs that started before it, so the wait ends.
    Only for regions whose reductions read no other reduction (softmax's online pair, a sum, a sum of squares):
    a reduction of a reduction needs the row's first result before its own pass."""
    order, slots = _slots(g, reds, helpers)
    stage = {r for r, _ in order}
    if any(_reductions_under(g, r) & stage for r in stage):
        raise HopelessConfig(f"the one-read form needs reductions that read no other reduction; this region has "
                             f"{len(order)} stages in a chain")
    total = blocks * parts
    first = _head(c, parts, span, rows, wide, ("blk", "part"))
    for r, partner in order:
        first += _partial(g, r, partner, slots, rows, parts, {}, CHUNK, set(), helpers, "part")
    second = _head(c, parts, span, rows, wide, ("blk", "part"))
    env: dict[fx.Node, str] = {}
    loaded: set = set()
    _combined(g, order, slots, rows, parts, reds, env, second, loaded, helpers, c)
    second += helpers["write_outputs"](g, env, CHUNK, loaded, "rmask & (rows * 0 + c_lo == 0)")
    signature = ", ".join(ptrs + ["part_ptr", "sync_ptr", "BLOCK_R: tl.constexpr", "BLOCK_C: tl.constexpr"])
    lines = [f"    k = tl.atomic_add(sync_ptr + {blocks}, 1)  # a ticket: every lower ticket's program has started",
             f"    if k < {total}:",
             f"        blk = k // {parts}",
             f"        part = k % {parts}",
             *_indent(first),
             "        tl.debug_barrier()  # every thread's partials stored before the count says so",
             "        tl.atomic_add(sync_ptr + blk, 1, sem='release')",
             f"    if k >= {lag}:",
             f"        blk = (k - {lag}) // {parts}",
             f"        part = (k - {lag}) % {parts}",
             "        done = tl.atomic_add(sync_ptr + blk, 0, sem='acquire')",
             f"        while done < {parts}:",
             "            done = tl.atomic_add(sync_ptr + blk, 0, sem='acquire')",
             *_indent(second)]
    return f"@triton.jit\ndef {name}_kernel({signature}):\n" + "\n".join(lines) + "\n", len(slots)


CHUNK = ["    for c0 in range(c_lo, c_hi, BLOCK_C):", "        cols = c0 + cbase", "        cmask = cols < c_hi",
         "        mask = rmask & cmask"]


def _slots(g: Any, reds: list[fx.Node], helpers: dict[str, Any]) -> tuple[list, dict[fx.Node, int]]:
    """The stages and each reduction's partial slot."""
    order = stages(g, reds, helpers["online_partner"])
    slots: dict[fx.Node, int] = {}
    for r, partner in order:
        slots[r] = len(slots)
        if partner is not None:
            slots[partner] = len(slots)
    return order, slots


def _head(c: int, parts: int, span: int, rows: int, wide: bool, pids: tuple[str, str]) -> list[str]:
    """A program's rows and its share of them, from the row block and share ids ``pids``."""
    return [f"    rows = {pids[0]}.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]",
            f"    rmask = rows < {rows}",
            f"    cbase = tl.arange(0, BLOCK_C)[None, :]{'.to(tl.int64)' if wide else ''}",
            f"    c_lo = {pids[1]} * {span}",
            f"    c_hi = tl.minimum(c_lo + {span}, {c})",
            f"    sidx = tl.arange(0, {pow2(parts)})[None, :]",
            f"    smask = rmask & (sidx < {parts})"]


def _indent(lines: list[str]) -> list[str]:
    return ["    " + line for line in lines]


def _combined(g: Any, order: list, slots: dict[fx.Node, int], rows: int, parts: int, reds: list[fx.Node],
              env: dict[fx.Node, str], lines: list[str], loaded: set, helpers: dict[str, Any], c: int) -> None:
    """The stages ``order``'s partials combined into row scalars, then each picked element (cross-entropy's target)
    whose row scalars are at hand."""
    for r, partner in order:
        _combine(r, partner, slots, rows, parts, env, lines, helpers["cross_lane"])
    for r in reds:
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
             env: dict[fx.Node, str], chunk: list[str], loaded: set, helpers: dict[str, Any],
             share: str) -> list[str]:
    """This program's partial of stage ``r`` over its share of the row, stored in its slot (render.fold's loop)."""
    lines: list[str] = []
    g.ensure(helpers["scalar_ancestors"](g, r, env), env, "    ", lines, loaded)
    folded, values = helpers["fold"](g, r, partner, env, chunk, loaded)
    lines += folded
    for node, value in zip((r, partner), values):
        lines.append(f"    tl.store({_slot(slots[node], rows, parts)} + {share}, {value}, mask=rmask)")
    return lines
