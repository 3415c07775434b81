"""The scan family: which regions it claims, its config space, and the kernel."""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx as fx

from kernelevolve.analyze.graph import CapturedGraph, dtype, op_name, shape
from kernelevolve.analyze.pointwise import TL_DTYPES, emit
from kernelevolve.templates.base import HopelessConfig, Match, make_match
from kernelevolve.templates.graphutil import ancestors_within, feeding_prologue, pow2
from kernelevolve.templates.pointwise import broadcast_strides, load_type, offset_expr

# the ATen scan, the operation its chunks combine with, and that operation's identity
SCANS = {"cumsum": ("tl.cumsum", "+", "0"), "cumprod": ("tl.cumprod", "*", "1")}
MAX_TILE = 16384  # elements of one tile: beyond it the scan's registers spill


def _flip_of(node: Any, d: int) -> bool:
    """``node`` is a ``flip`` of only dimension ``d``."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and op_name(node) == "flip"):
        return False
    rank = len(shape(node))
    return rank > 0 and sorted({int(x) % rank for x in node.args[1]}) == [d]



FILLS = {"full_like": 1, "full": 1, "new_full": 2, "zeros_like": 0.0, "zeros": 0.0, "new_zeros": 0.0,
         "ones_like": 1.0, "ones": 1.0, "new_ones": 1.0}  # where the value sits in the args, or the value itself
FRONT_VIEWS = {"select", "unsqueeze", "slice", "view", "expand", "narrow"}  # what only shapes a fill's size


def _exclusive(seed: fx.Node, d: int, used: set[fx.Node]) -> tuple[fx.Node, float, set[fx.Node]] | None:
    """``cat([c, scan], d)`` with ``c`` a constant column (``zeros_like(x[:, :1])``, ``full((n, 1), 0)``): the cat,
    the constant, and the fill's nodes (the constant and the views of the input that only give it its shape)."""
    users = list(seed.users)
    if len(users) != 1 or op_name(users[0]) != "cat" or users[0] in used:
        return None
    cat = users[0]
    parts, dim = cat.args[0], cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    full = shape(seed)
    if len(parts) != 2 or parts[1] is not seed or int(dim) % len(full) != d or not isinstance(parts[0], fx.Node):
        return None
    front = parts[0]
    where = FILLS.get(op_name(front))
    value = front.args[where] if isinstance(where, int) and len(front.args) > where else where
    if (value is None or isinstance(value, fx.Node) or front in used or list(front.users) != [cat]
            or shape(front) != tuple(1 if k == d else n for k, n in enumerate(full))):
        return None
    extra, todo = {cat, front}, [a for a in front.all_input_nodes]
    while todo:  # the views that give the constant its shape, where nothing else reads them
        n = todo.pop()
        if n.op == "call_function" and op_name(n) in FRONT_VIEWS and n not in used and all(u in extra
                                                                                          for u in n.users):
            extra.add(n)
            todo.extend(n.all_input_nodes)
    return cat, float(value), extra


def _narrowed(src: Any, d: int, full: tuple[int, ...], used: set[fx.Node], seed: fx.Node) -> bool:
    """``src`` is its input without the last position along ``d`` (``x[:, :-1]``, ``narrow(d, 0, n - 1)``)."""
    if not (isinstance(src, fx.Node) and op_name(src) == "slice" and src not in used and list(src.users) == [seed]):
        return False
    base = shape(src.args[0])
    args = list(src.args) + [None] * 5
    start, step = args[2] or 0, args[4] if args[4] is not None else 1
    return (len(base) == len(full) and int(args[1]) % len(full) == d and start == 0 and step == 1
            and base[d] == full[d] + 1)


def accumulator(out: torch.dtype) -> str:
    """What a scan adds or multiplies in: fp32 for the 16- and 32-bit floats, else the output's own type."""
    if out in (torch.float16, torch.bfloat16, torch.float32):
        return "tl.float32"
    return TL_DTYPES.get(out, "tl.float32")


class ScanTemplate:
    family = "scan"

    def find(self, graph: CapturedGraph, taken: set[fx.Node]) -> list[Match]:
        matches: list[Match] = []
        used = set(taken)
        for seed in graph.calls():
            if seed in used or op_name(seed) not in SCANS or not isinstance(seed.meta.get("val"), torch.Tensor):
                continue
            full = shape(seed)
            if not full or math.prod(full) == 0:
                continue
            d = int(seed.args[1]) % len(full)
            region, src = {seed}, seed.args[0]
            read_rev = _flip_of(src, d) and src not in used and list(src.users) == [seed]
            if read_rev:
                region.add(src)
                src = src.args[0]
            out = seed
            if len(seed.users) == 1 and _flip_of(next(iter(seed.users)), d) and next(iter(seed.users)) not in used:
                out = next(iter(seed.users))
                region.add(out)
            loaded, fill = full, None
            front = _exclusive(seed, d, used) if out is seed and not read_rev else None
            if front is not None:  # cat([identity column, scan(x[..., :-1])]): the scan stored one place later
                out, fill, extra = front
                region |= extra
                if _narrowed(src, d, full, used, seed):
                    region.add(src)
                    src = src.args[0]
                    loaded = shape(src)
            region |= feeding_prologue(src, loaded, used | region)
            spec = {"full": list(full), "dim": d, "op": op_name(seed), "scan": seed.name, "source": src.name,
                    "read_reversed": read_rev, "write_reversed": out is not seed and fill is None,
                    "loaded": list(loaded), "fill": fill}
            m = make_match(self.family, list(region), spec)
            if m is None or m.outputs != [out]:
                continue
            matches.append(m)
            used |= set(m.nodes)
        return matches

    def space(self, match: Match, device: str) -> dict[str, list[Any]]:
        space: dict[str, list[Any]] = {"TILE": [2048, 4096, 1024, 8192, 512], "num_warps": [4, 8, 2, 16]}
        full, d = match.spec["full"], match.spec["dim"]
        if math.prod(full[d + 1:]) > 1:  # rows along an inner dimension: how many are read side by side
            space["COLS"] = [32, 64, 16, 128]
        return space

    def render(self, match: Match, config: dict[str, Any], name: str) -> str:
        full, d = tuple(match.spec["full"]), match.spec["dim"]
        outer, length, inner = math.prod(full[:d]), full[d], math.prod(full[d + 1:])
        scan_fn, combine, identity = SCANS[match.spec["op"]]
        out_node = match.outputs[0]
        acc = accumulator(dtype(out_node))
        tile, warps = int(config["TILE"]), int(config["num_warps"])
        if inner == 1:
            block = min(pow2(length), tile)
            rows = max(1, min(tile // block, pow2(outer)))
            axis, lead = 1, f"{name}_rows"
            grid = -(-outer // rows)
        else:
            cols = min(int(config.get("COLS", 32)), pow2(inner))
            block = max(1, min(pow2(length), tile // cols))
            axis, lead = 0, f"{name}_cols"
            grid = outer * -(-inner // cols)
        if (rows if inner == 1 else cols) * block > MAX_TILE:
            raise HopelessConfig(f"a tile of {(rows if inner == 1 else cols) * block} elements spills")
        loaded = tuple(match.spec.get("loaded") or full)  # the input before a dropped last position, if any
        fill = match.spec.get("fill")
        out_type = TL_DTYPES[dtype(out_node)]
        width = rows if inner == 1 else cols
        lines = self._setup(inner, outer, width, block, acc, identity)
        if fill is not None:  # an exclusive scan: the constant first, the scan one place later
            first = f"(o < {outer})" if inner == 1 else "(i < INNER)"
            shape_ = f"[{width}, 1]" if inner == 1 else f"[1, {width}]"
            lines.insert(3, f"    tl.store(out_ptr + o * LOUT * INNER + i, tl.full({shape_}, {fill!r}, {out_type}), "
                             f"mask={first})")
        pos = "(L - 1 - p)" if match.spec["read_reversed"] else "p"
        lines.append(f"        idx = (o * LIN + {pos}) * INNER + i")
        src = next(n for n in match.inputs + match.nodes if n.name == match.spec["source"])
        feeding = set(ancestors_within(src, set(match.inputs)))  # the region is convex: its inputs bound the walk
        prologue = [n for n in match.nodes if n in feeding]
        env: dict[fx.Node, str] = {}
        for k, node in enumerate(match.inputs):
            if node is not src and not any(node in n.all_input_nodes for n in prologue):
                continue  # read only for its shape (what sized an exclusive scan's constant)
            off = offset_expr(loaded, broadcast_strides(shape(node), loaded), "idx")
            where = ", mask=m" if "idx" in off else ""  # one value broadcast along every dimension: a scalar load
            lines.append(f"        in{k} = tl.load(in{k}_ptr + {off}{where}).to({load_type(node)})")
            env[node] = f"in{k}"
        body: list[str] = []
        env = emit(prologue, env, body)
        lines += ["        " + b for b in body]
        lines.append(f"        x = tl.where(m, ({env[src]}).to({acc}), {identity})")
        lines.append(f"        y = {scan_fn}(x, axis={axis})")
        lines.append(f"        y = y {combine} carry{'[:, None]' if axis == 1 else '[None, :]'}")
        reduce = f"tl.sum(x, axis={axis})" if combine == "+" else f"tl.reduce(x, {axis}, {name}_mul)"
        lines.append(f"        carry = carry {combine} {reduce}")
        wpos = "(L - 1 - p)" if match.spec["write_reversed"] else "p"
        shift = " + 1" if fill is not None else ""
        lines.append(f"        tl.store(out_ptr + (o * LOUT + {wpos}{shift}) * INNER + i, y.to({out_type}), mask=m)")
        ins = [f"in{k}" for k in range(len(match.inputs))]
        ptrs = ", ".join([f"{a}_ptr" for a in ins] + ["out_ptr"])
        kernel = "\n".join(lines)
        return f'''
@triton.jit
def {name}_mul(a, b):
    return a * b


@triton.jit
def {lead}({ptrs}, L: tl.constexpr, LIN: tl.constexpr, LOUT: tl.constexpr, INNER: tl.constexpr,
        BLOCK: tl.constexpr):
{kernel}


def {name}({", ".join(ins)}):
    {"; ".join(f"{a} = {a}.contiguous()" for a in ins)}
    out = torch.empty({list(shape(out_node))!r}, dtype={dtype(out_node)}, device=in0.device)
    {lead}[({grid},)]({", ".join(ins)}, out, L={length}, LIN={loaded[d]}, LOUT={shape(out_node)[d]}, INNER={inner},
        BLOCK={block}, num_warps={warps})
    return (out,)
'''

    @staticmethod
    def _setup(inner: int, outer: int, width: int, block: int, acc: str, identity: str) -> list[str]:
        """The program's rows and the loop over chunks, up to the chunk's positions ``p`` and its mask ``m``."""
        if inner == 1:  # [ROWS, BLOCK]: rows of the last dimension
            return [f"    o = tl.program_id(0).to(tl.int64) * {width} + tl.arange(0, {width})[:, None]",
                    "    i = 0",
                    f"    carry = tl.full([{width}], {identity}, {acc})",
                    "    for start in range(0, L, BLOCK):",
                    "        p = start + tl.arange(0, BLOCK)[None, :]",
                    f"        m = (o < {outer}) & (p < L)"]
        tiles = -(-inner // width)
        return [f"    o = tl.program_id(0).to(tl.int64) // {tiles}",
                f"    i = (tl.program_id(0) % {tiles}) * {width} + tl.arange(0, {width})[None, :]",
                f"    carry = tl.full([{width}], {identity}, {acc})",
                "    for start in range(0, L, BLOCK):",
                "        p = start + tl.arange(0, BLOCK)[:, None]",
                "        m = (p < L) & (i < INNER)"]
