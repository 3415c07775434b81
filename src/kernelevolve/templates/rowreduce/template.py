"""The row-reduction family: which regions it claims, its config space, and its render entry."""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx as fx

from kernelevolve.analyze.graph import CapturedGraph, convex_core, dtype, op_name, shape
from kernelevolve.analyze.pointwise import TL_DTYPES, can_emit
from kernelevolve.templates.base import Match, make_match
from kernelevolve.templates.graphutil import pow2
from kernelevolve.templates.rowreduce.frame import MAX_TILE, VIEWS, Frame, keepdim, reduced_dim



class RowReduceTemplate:
    family = "row_reduction"

    def find(self, graph: CapturedGraph, taken: set[fx.Node]) -> list[Match]:
        matches: list[Match] = []
        used = set(taken)
        for seed in graph.calls():
            d = reduced_dim(seed)
            if seed in used or d is None:
                continue
            frame = Frame(shape(seed.args[0]), d)
            region = self._grow(seed, frame, used)
            if region is None:
                continue
            sq = self._squeezed(region, frame)
            m = make_match(self.family, list(region), {"full": list(frame.full), "dim": d,
                                                      "squeezed": sorted(n.name for n in sq)})
            if m is None or not self._storable(m, frame, sq):
                continue
            kind = "column_reduction" if d != len(frame.full) - 1 else "row_reduction"
            m.kind = kind
            matches.append(m)
            used |= set(m.nodes)
        return matches

    def _admits(self, n: fx.Node, frame: Frame) -> bool:
        if n.op != "call_function" or not isinstance(n.meta.get("val"), torch.Tensor):
            return False
        s = shape(n)
        name = op_name(n)
        if reduced_dim(n) is not None:
            return shape(n.args[0]) == frame.full and reduced_dim(n) == frame.d
        if name == "expand":  # a row scalar broadcast along the row: free, it stays a [BLOCK_R, 1] value
            return shape(n.args[0]) == frame.scal and s == frame.full
        if name in VIEWS:
            src = shape(n.args[0])
            if s != src and frame.trim(s) == frame.trim(src):  # only trailing unit dims come or go: free
                return frame.trim(s) in (frame.full, frame.scal)
            return s in (frame.scal, frame.sq) and src in (frame.scal, frame.sq)
        if name == "gather":
            return (len(n.args) >= 3 and n.args[1] % len(frame.full) == frame.d and s == frame.scal
                    and shape(n.args[0]) == frame.full)
        if frame.extended(s) or any(frame.extended(shape(a)) for a in n.all_input_nodes):
            # in the extended frame ([N, G, C, 1] for [N, G, C]) broadcasting matches the frame's only when every
            # tensor operand carries the same trailing unit dims
            ranks = {len(shape(a)) for a in n.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)
                     and math.prod(shape(a)) != 1}
            if ranks != {len(s)} or not frame.extended(s):
                return False
        return can_emit(n) and (frame.fits(s) or frame.fits_sq(s))

    def _grow(self, seed: fx.Node, frame: Frame, used: set[fx.Node]) -> set[fx.Node] | None:
        region, stack = {seed}, [seed]
        while stack:
            n = stack.pop()
            # producers, consumers, and siblings: other readers of the same inputs join as extra outputs of the one
            # kernel instead of launching their own (cross-entropy's ignore-index count, say)
            siblings = [u for a in n.all_input_nodes if a not in region for u in a.users if can_emit(u)]
            for nb in list(n.all_input_nodes) + list(n.users) + siblings:
                if nb not in region and nb not in used and self._admits(nb, frame):
                    region.add(nb)
                    stack.append(nb)
        region = convex_core(region)
        if seed not in region:
            return None
        # a value that leaves the region must be storable: a vector of shape F or a row scalar
        changed = True
        while changed:
            changed = False
            for n in list(region):
                leaves = any(u not in region for u in n.users)
                if leaves and frame.trim(shape(n)) not in (frame.full, frame.scal, frame.sq) and n is not seed:
                    region.discard(n)
                    changed = True
        return region

    def _squeezed(self, region: set[fx.Node], frame: Frame) -> set[fx.Node]:
        """Nodes that live in the squeezed frame, decided by provenance in graph order."""
        order = {n: i for i, n in enumerate(next(iter(region)).graph.nodes)}
        sq: set[fx.Node] = set()
        for n in sorted(region, key=order.__getitem__):
            if reduced_dim(n) is not None:
                if not keepdim(n):
                    sq.add(n)
            elif op_name(n) in VIEWS:
                if shape(n) == frame.sq and frame.sq != frame.scal and not frame.extended(shape(n.args[0])):
                    sq.add(n)
            elif op_name(n) != "gather":
                only_sq = frame.fits_sq(shape(n)) and not frame.fits(shape(n))
                if only_sq or any(a in sq for a in n.all_input_nodes):
                    sq.add(n)
        return sq

    def _storable(self, m: Match, frame: Frame, sq: set[fx.Node]) -> bool:
        if not any(reduced_dim(n) is not None for n in m.nodes):
            return False
        if any(op_name(o) == "expand" for o in m.outputs):  # held as a row scalar, it has no full tile to store
            return False
        for n in m.nodes:
            if n in sq and not frame.fits_sq(shape(n)):
                return False
            if n not in sq and not frame.fits(shape(n)) and op_name(n) not in VIEWS:
                return False
            if op_name(n) in VIEWS or reduced_dim(n) is not None:  # these read the full frame by definition
                continue
            mixed = [a for a in n.all_input_nodes if a in m.nodes]
            if n in sq and any(a not in sq and math.prod(shape(a)) != 1 for a in mixed):
                return False
        return all(dtype(o) in TL_DTYPES for o in m.outputs)

    def space(self, match: Match, device: str) -> dict[str, list[Any]]:
        full, d = match.spec["full"], match.spec["dim"]
        c = full[d]
        rows = 1
        for i, s in enumerate(full):
            rows *= s if i != d else 1
        persistent = [True, False] if pow2(c) <= MAX_TILE else [False]
        if d != len(full) - 1:  # a column reduction: tiles along the contiguous row dim
            block_r = [64, 32, 128, 16, 256]
        else:
            block_r = [1, 2, 4, 8, 16] if c >= 512 else [16, 8, 32, 4, 64]
        out = {"PERSISTENT": persistent, "BLOCK_R": block_r, "BLOCK_C": [2048, 1024, 4096, 512, 256, 64],
               "num_warps": [],
               "num_stages": [1, 2, 3]}
        if splittable(match):
            # few rows and long reductions leave most SMs idle (1024 rows / 64 per program = 16 programs on 132 SMs)
            out["SPLIT"] = [16, 1, 4, 8, 32, 64] if rows < 8192 and c >= 4096 else [1, 4, 16, 64]
            out["PERSISTENT"] = [False] + [p for p in persistent if p is not False]
            if d != len(full) - 1:
                out["BLOCK_C"] = [64, 32, 128, 16]
        if d == len(full) - 1 and c > MAX_TILE:
            # rows wider than a persistent tile: several programs may share a row (rowreduce/split.py), the first
            # choice enough of them for about 16 programs on each of ~132 SMs
            first = _parts(rows, out["BLOCK_R"][0])
            out["PARTS"] = list(dict.fromkeys([first] + [p for p in (1, 4, 8, 16, 32, 64) if p != first]))
            # shared rows read once from memory, in one kernel (reductions that read no other reduction only)
            out["ONE_READ"] = [False, True]
        tile = (pow2(c) if out["PERSISTENT"][0] else min(out["BLOCK_C"][0], pow2(c))) * min(out["BLOCK_R"][0], rows)
        out["num_warps"] = _warps(tile)
        return out

    def render(self, match: Match, config: dict[str, Any], name: str) -> str:
        from kernelevolve.templates.rowreduce.render import render_region

        return render_region(match, config, name, Frame(tuple(match.spec["full"]), match.spec["dim"]))


def _parts(rows: int, block_r: int, programs: int = 2048) -> int:
    """Programs per row (a power of two up to 64) for at least ``programs`` programs in all."""
    blocks = -(-rows // block_r)
    parts = 1
    while blocks * parts < programs and parts < 64:
        parts *= 2
    return parts


def _warps(tile: int) -> list[int]:
    """Warps for a tile of ``tile`` fp32 values, first: about 16-32 values per thread keeps loads in flight without
    spilling (the launch-setting rule of Liger-Kernel's calculate_settings)."""
    first = 16 if tile >= 16384 else 8 if tile >= 4096 else 4 if tile >= 1024 else 2
    return [first] + [w for w in (4, 8, 16, 2, 1) if w != first]


def splittable(match: Match) -> bool:
    """A lone fp32 sum whose output is the sum itself can be split along the reduced dim, finished by atomic adds."""
    reds = [n for n in match.nodes if reduced_dim(n) is not None or op_name(n) == "gather"]
    return (len(reds) == 1 and op_name(reds[0]) == "sum" and match.outputs == reds
            and dtype(reds[0]) == torch.float32)
