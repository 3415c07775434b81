"""The pooling family: which regions it claims, its config space, and the kernel."""
from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx as fx

from kernelevolve.analyze.graph import CapturedGraph, dtype, op_name, shape
from kernelevolve.analyze.pointwise import TL_DTYPES, emit
from kernelevolve.templates.base import Match, make_match
from kernelevolve.templates.graphutil import bind, feeding_prologue
from kernelevolve.templates.pointwise import broadcast_strides, load_type, offset_expr

# the ATen pool and the number of spatial dims it pools over
POOLS = {"avg_pool2d": 2, "avg_pool3d": 3, "max_pool2d_with_indices": 2, "max_pool3d_with_indices": 3}
UNROLL = 64  # windows up to this many elements are unrolled; larger ones walk a loop



def _per_dim(value: Any, nd: int, default: Any = None) -> list[int]:
    """A pool argument as one int per spatial dim (PyTorch takes one value for all, or one each)."""
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        value = default
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value] * (nd if len(value) == 1 else 1)
    return [int(value)] * nd


def pool_spec(node: fx.Node) -> dict[str, Any] | None:
    """The window of a pool node as plain data, or None for a form the kernel does not write."""
    name = op_name(node)
    nd = POOLS[name]
    a = bind(node)
    kernel = _per_dim(a["kernel_size"], nd)
    spec = {"op": "max" if name.startswith("max") else "avg", "nd": nd, "kernel": kernel,
            "stride": _per_dim(a["stride"], nd, kernel), "padding": _per_dim(a["padding"], nd, 0),
            "dilation": _per_dim(a.get("dilation"), nd, 1), "count_include_pad": bool(a.get("count_include_pad", True)),
            "divisor": a.get("divisor_override")}
    if len(spec["kernel"]) != nd or len(spec["stride"]) != nd or len(spec["padding"]) != nd:
        return None
    return spec


def _unit_view(node: Any, name: str) -> bool:
    """An ``unsqueeze`` or ``squeeze`` of the dim before the last (how a 1-D pool reaches the graph)."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and op_name(node) == name):
        return False
    dims = node.args[1] if len(node.args) > 1 else None
    dims = dims if isinstance(dims, (list, tuple)) else [dims]
    rank = len(shape(node)) if name == "unsqueeze" else len(shape(node.args[0]))
    return len(dims) == 1 and isinstance(dims[0], int) and dims[0] % rank == rank - 2


class PoolTemplate:
    family = "pool"

    def find(self, graph: CapturedGraph, taken: set[fx.Node]) -> list[Match]:
        matches: list[Match] = []
        used = set(taken)
        for seed in graph.calls():
            if seed in used or op_name(seed) not in POOLS:
                continue
            region, out = {seed}, seed
            if op_name(seed).startswith("max"):  # the values, and never the indices
                users = list(seed.users)
                if len(users) != 1 or users[0].target is not operator.getitem or users[0].args[1] != 0:
                    continue
                out = users[0]
                region.add(out)
            src = seed.args[0]
            if not isinstance(out.meta.get("val"), torch.Tensor) or len(shape(src)) != POOLS[op_name(seed)] + 2:
                continue
            spec = pool_spec(seed)
            if spec is None:
                continue
            pooled = shape(out)
            # a 1-D pool: the unit dim inserted before and dropped after move no data in contiguous tensors
            if _unit_view(src, "unsqueeze") and list(src.users) == [seed] and src not in used:
                region.add(src)
                src = src.args[0]
            if len(out.users) == 1 and _unit_view(next(iter(out.users)), "squeeze"):
                out = next(iter(out.users))
                region.add(out)
            region |= feeding_prologue(src, shape(src), used | region)
            spec.update(full=list(shape(seed.args[0])), loaded=list(shape(src)), out=list(pooled), pool=seed.name,
                        source=src.name)
            m = make_match(self.family, list(region), spec)
            if m is None or m.outputs != [out]:
                continue
            matches.append(m)
            used |= set(m.nodes)
        return matches

    def space(self, match: Match, device: str) -> dict[str, list[Any]]:
        return {"BLOCK": [256, 512, 128, 1024], "num_warps": [4, 8, 2]}

    def render(self, match: Match, config: dict[str, Any], name: str) -> str:
        s = match.spec
        full, out_shape, nd = tuple(s["full"]), tuple(s["out"]), s["nd"]
        loaded = tuple(s.get("loaded", full))  # the input before a 1-D pool's unit dim: the same flat index
        out_node = match.outputs[0]
        numel = math.prod(out_shape)
        block = min(int(config["BLOCK"]), max(16, 1 << (numel - 1).bit_length()))
        sizes, outs = full[2:], out_shape[2:]
        lines = [f"    q = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)",
                 f"    live = q < {numel}"]
        # the output's coordinates, last dim first; nc runs over batch and channels together
        rest = "q"
        for k in reversed(range(nd)):
            lines.append(f"    o{k} = {rest} % {outs[k]}")
            rest = f"({rest} // {outs[k]})"
        lines.append(f"    nc = {rest}")
        for k in range(nd):
            lines.append(f"    s{k} = o{k} * {s['stride'][k]} - {s['padding'][k]}")
        window = math.prod(s["kernel"])
        is_max = s["op"] == "max"
        start = "float('-inf')" if is_max else "0.0"
        lines.append(f"    acc = tl.full([BLOCK], {start}, tl.float32)")
        loop = (f"    for t in tl.static_range({window}):" if window <= UNROLL else f"    for t in range({window}):")
        lines.append(loop)
        inner = 1
        for k in reversed(range(nd)):  # the window position of each dim, from the flat window index t
            lines.append(f"        w{k} = (t // {inner}) % {s['kernel'][k]}")
            inner *= s["kernel"][k]
        for k in range(nd):
            lines.append(f"        p{k} = s{k} + w{k} * {s['dilation'][k]}")
        inside = " & ".join(f"(p{k} >= 0) & (p{k} < {sizes[k]})" for k in range(nd))
        lines.append(f"        m = live & {inside}")
        flat = "nc"
        for k in range(nd):
            flat = f"({flat}) * {sizes[k]} + p{k}"
        lines.append(f"        idx = {flat}")
        env: dict[fx.Node, str] = {}
        for k, node in enumerate(match.inputs):
            off = offset_expr(loaded, broadcast_strides(shape(node), loaded), "idx")
            where = ", mask=m" if "idx" in off else ""
            lines.append(f"        in{k} = tl.load(in{k}_ptr + {off}{where}).to({load_type(node)})")
            env[node] = f"in{k}"
        body: list[str] = []
        prologue = [n for n in match.nodes if op_name(n) not in POOLS and n.target is not operator.getitem
                    and not _unit_view(n, "unsqueeze") and not _unit_view(n, "squeeze")]
        env = emit(prologue, env, body)
        lines += ["        " + b for b in body]
        src = next(n for n in match.inputs + match.nodes if n.name == s["source"])
        if is_max:
            lines.append(f"        v = tl.where(m, ({env[src]}).to(tl.float32), float('-inf'))")
            lines.append("        acc = tl.where((v > acc) | (v != v), v, acc)")
        else:
            lines.append(f"        acc += tl.where(m, ({env[src]}).to(tl.float32), 0.0)")
            lines += self._divisor(s, sizes)
        lines.append(f"    tl.store(out_ptr + q, acc.to({TL_DTYPES[dtype(out_node)]}), mask=live)")
        ins = [f"in{k}" for k in range(len(match.inputs))]
        ptrs = ", ".join([f"{a}_ptr" for a in ins] + ["out_ptr"])
        kernel = "\n".join(lines)
        grid = -(-numel // block)
        return f'''
@triton.jit
def {name}_kernel({ptrs}, BLOCK: tl.constexpr):
{kernel}


def {name}({", ".join(ins)}):
    {"; ".join(f"{a} = {a}.contiguous()" for a in ins)}
    out = torch.empty({list(shape(out_node))!r}, dtype={dtype(out_node)}, device=in0.device)
    {name}_kernel[({grid},)]({", ".join(ins)}, out, BLOCK={block}, num_warps={int(config["num_warps"])})
    return (out,)
'''

    @staticmethod
    def _divisor(s: dict[str, Any], sizes: tuple[int, ...]) -> list[str]:
        """After the window: the average's divisor as PyTorch counts it (lines at the kernel's outer level)."""
        if s["divisor"]:
            return [f"    acc = acc / {float(s['divisor'])}"]
        nd, terms = s["nd"], []
        for k in range(nd):
            end = f"tl.minimum(s{k} + {s['kernel'][k]}, {sizes[k] + s['padding'][k]})"
            if s["count_include_pad"]:  # the window clipped to the padded input
                terms.append(f"({end} - s{k})")
            else:  # the window clipped to the input itself
                terms.append(f"(tl.minimum({end}, {sizes[k]}) - tl.maximum(s{k}, 0))")
        return [f"    acc = acc / ({' * '.join(terms)}).to(tl.float32)"]
