"""The scan family: which regions it claims, its config space, and the kernel."""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx as fx

from kernelevolve.analyze.graph import CapturedGraph, dtype, op_name, shape
from kernelevolve.analyze.pointwise import TL_DTYPES, can_emit, emit
from kernelevolve.templates.base import HopelessConfig, Match, make_match
from kernelevolve.templates.graphutil import pow2
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


def _fits(node: fx.Node, full: tuple[int, ...]) -> bool:
    """Broadcastable to ``full`` without growing it."""
    s = shape(node)
    return len(s) <= len(full) and all(a == b or a == 1 for a, b in zip(reversed(s), reversed(full)))


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
            region |= self._prologue(src, full, used | region)
            spec = {"full": list(full), "dim": d, "op": op_name(seed), "scan": seed.name, "source": src.name,
                    "read_reversed": read_rev, "write_reversed": out is not seed}
            m = make_match(self.family, list(region), spec)
            if m is None or m.outputs != [out]:
                continue
            matches.append(m)
            used |= set(m.nodes)
        return matches

    def _prologue(self, src: Any, full: tuple[int, ...], used: set[fx.Node]) -> set[fx.Node]:
        """The pointwise ops that only feed the scan (``x * mask``), back to the inputs: the scan's input of its full
        shape, the values before it broadcast to it (a scale of one row, a scalar)."""
        region: set[fx.Node] = set()
        stack = [src]
        while stack:
            n = stack.pop()
            if (not isinstance(n, fx.Node) or n in used or n in region or n.op != "call_function"
                    or not can_emit(n) or not _fits(n, full) or (n is src and shape(n) != full)
                    or any(not _fits(a, full) for a in n.all_input_nodes)):
                continue
            if any(u not in region and u not in used for u in n.users) and n is not src:
                continue
            region.add(n)
            stack.extend(n.all_input_nodes)
        # a node read by something outside (besides the scan chain) would be a second output: only the chain stays
        inside = used | region
        return {n for n in region if all(u in inside for u in n.users)}

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
        lines = self._setup(inner, outer, length, rows if inner == 1 else cols, block, acc, identity)
        pos = "(L - 1 - p)" if match.spec["read_reversed"] else "p"
        lines.append(f"        idx = (o * L + {pos}) * INNER + i")
        env: dict[fx.Node, str] = {}
        for k, node in enumerate(match.inputs):
            off = offset_expr(full, broadcast_strides(shape(node), full), "idx")
            where = ", mask=m" if "idx" in off else ""  # one value broadcast along every dimension: a scalar load
            lines.append(f"        in{k} = tl.load(in{k}_ptr + {off}{where}).to({load_type(node)})")
            env[node] = f"in{k}"
        body: list[str] = []
        prologue = [n for n in match.nodes if n.name not in (match.spec["scan"],) and op_name(n) != "flip"]
        env = emit(prologue, env, body)
        lines += ["        " + b for b in body]
        src = next(n for n in match.inputs + match.nodes if n.name == match.spec["source"])
        lines.append(f"        x = tl.where(m, ({env[src]}).to({acc}), {identity})")
        lines.append(f"        y = {scan_fn}(x, axis={axis})")
        lines.append(f"        y = y {combine} carry{'[:, None]' if axis == 1 else '[None, :]'}")
        reduce = f"tl.sum(x, axis={axis})" if combine == "+" else f"tl.reduce(x, {axis}, {name}_mul)"
        lines.append(f"        carry = carry {combine} {reduce}")
        wpos = "(L - 1 - p)" if match.spec["write_reversed"] else "p"
        lines.append(f"        tl.store(out_ptr + (o * L + {wpos}) * INNER + i, y.to({TL_DTYPES[dtype(out_node)]}), mask=m)")
        ins = [f"in{k}" for k in range(len(match.inputs))]
        ptrs = ", ".join([f"{a}_ptr" for a in ins] + ["out_ptr"])
        kernel = "\n".join(lines)
        return f'''
@triton.jit
def {name}_mul(a, b):
    return a * b


@triton.jit
def {lead}({ptrs}, L: tl.constexpr, INNER: tl.constexpr, BLOCK: tl.constexpr):
{kernel}


def {name}({", ".join(ins)}):
    {"; ".join(f"{a} = {a}.contiguous()" for a in ins)}
    out = torch.empty({list(full)!r}, dtype={dtype(out_node)}, device=in0.device)
    {lead}[({grid},)]({", ".join(ins)}, out, L={length}, INNER={inner}, BLOCK={block}, num_warps={warps})
    return (out,)
'''

    @staticmethod
    def _setup(inner: int, outer: int, length: int, width: int, block: int, acc: str, identity: str) -> list[str]:
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
