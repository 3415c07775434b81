"""The pointwise family's template: matching, search space and the kernel."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from kernelevolve.analyze.graph import CapturedGraph, convex_core, dtype, shape
from kernelevolve.analyze.pointwise import TL_DTYPES, can_emit, emit
from kernelevolve.templates.base import Match, make_match
from kernelevolve.templates.graphutil import broadcasts_to


def contiguous_strides(sizes: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


def broadcast_strides(src: tuple[int, ...], full: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of a contiguous ``src`` expanded to ``full`` (0 along broadcast dims)."""
    pad = (1,) * (len(full) - len(src)) + tuple(src)
    st = contiguous_strides(pad)
    return tuple(0 if p == 1 and f != 1 else s for p, s, f in zip(pad, st, full))


def merge_dims(full: tuple[int, ...], strides: list[tuple[int, ...]]) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Merge adjacent dims i, i+1 wherever every operand has stride[i] == stride[i+1] * size[i+1]."""
    sizes, sts = list(full), [list(s) for s in strides]
    i = len(sizes) - 2
    while i >= 0:
        if all(s[i] == s[i + 1] * sizes[i + 1] for s in sts):
            sizes[i] *= sizes[i + 1]
            del sizes[i + 1]
            for s in sts:
                s[i] = s[i + 1]
                del s[i + 1]
        i -= 1
    return tuple(sizes), [tuple(s) for s in sts]


def offset_expr(sizes: tuple[int, ...], strides: tuple[int, ...], idx: str) -> str:
    """The element offset of flat index ``idx`` (row-major over ``sizes``) for one operand's ``strides``."""
    if tuple(strides) == contiguous_strides(sizes):
        return idx
    terms, inner = [], 1
    for d in reversed(range(len(sizes))):
        if strides[d] != 0 and sizes[d] != 1:
            coord = idx if inner == 1 else f"({idx} // {inner})"
            if d > 0:
                coord = f"({coord} % {sizes[d]})"
            terms.append(coord if strides[d] == 1 else f"{coord} * {strides[d]}")
        inner *= sizes[d]
    return " + ".join(reversed(terms)) or "0"



class PointwiseTemplate:
    family = "pointwise"

    def find(self, graph: CapturedGraph, taken: set[fx.Node]) -> list[Match]:
        free = [n for n in graph.calls() if n not in taken and can_emit(n) and isinstance(n.meta.get("val"),
                                                                                            torch.Tensor)]
        seen: set[fx.Node] = set()
        matches = []
        for seed in reversed(free):  # grow from the last node back, so the output shape is the chain's result
            if seed in seen:
                continue
            full = shape(seed)
            if not full or len(full) > 6:
                continue
            region = convex_core(self._grow(seed, set(free) - seen, full))
            if seed not in region:
                # a path leaves the chain and comes back (a prologue read by a norm's statistics and by its affine):
                # the chain from the seed without what the first try kept is convex, and reads that as an input
                region = convex_core(self._grow(seed, set(free) - seen - region, full))
            if seed not in region:
                continue
            outs = [n for n in region if any(u not in region for u in n.users)]
            if any(shape(o) != full for o in outs):
                continue
            m = make_match(self.family, list(region), {"shape": list(full)})
            if m is not None:
                matches.append(m)
                seen |= region
        return matches

    def _grow(self, seed: fx.Node, pool: set[fx.Node], full: tuple[int, ...]) -> set[fx.Node]:
        region, stack = {seed}, [seed]
        while stack:
            n = stack.pop()
            # siblings (other full-shape readers of the same inputs) become more outputs of one kernel
            siblings = [u for a in n.all_input_nodes if a not in region for u in a.users if shape(u) == full]
            for nb in list(n.all_input_nodes) + list(n.users) + siblings:
                if nb in pool and nb not in region and broadcasts_to(nb, full):
                    if nb in n.users and shape(nb) != full:
                        continue
                    region.add(nb)
                    stack.append(nb)
        return region

    def space(self, match: Match, device: str) -> dict[str, list[Any]]:
        return {"BLOCK": [1024, 2048, 512, 4096, 256], "num_warps": [4, 8, 2, 16]}

    def render(self, match: Match, config: dict[str, Any], name: str) -> str:
        full = tuple(match.spec["shape"])
        numel = 1
        for s in full:
            numel *= s
        strides = [broadcast_strides(shape(i), full) for i in match.inputs]
        strides += [contiguous_strides(full)] * len(match.outputs)
        sizes, merged = merge_dims(full, strides)
        lines: list[str] = []
        env: dict[fx.Node, str] = {}
        for k, node in enumerate(match.inputs):
            off = offset_expr(sizes, merged[k], "offs")
            # an operand broadcast along every dimension is one scalar: it takes no block mask
            where = ", mask=mask" if "offs" in off else ""
            lines.append(f"in{k} = tl.load(in{k}_ptr + {off}{where}).to({load_type(node)})")
            env[node] = f"in{k}"
        env = emit(match.nodes, env, lines)
        outs = []
        for k, node in enumerate(match.outputs):
            lines.append(f"tl.store(out{k}_ptr + offs, {env[node]}.to({TL_DTYPES[dtype(node)]}), mask=mask)")
            outs.append(f"torch.empty({list(shape(node))!r}, dtype={dtype(node)}, device=_dev)")
        ptrs = [f"in{k}_ptr" for k in range(len(match.inputs))] + [f"out{k}_ptr" for k in range(len(match.outputs))]
        body = "\n".join("    " + line for line in lines)
        block = min(config["BLOCK"], max(16, 1 << (numel - 1).bit_length()))
        ins = ", ".join(f"in{k}" for k in range(len(match.inputs)))
        return f'''
@triton.jit
def {name}_kernel({", ".join(ptrs)}, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < {numel}
{body}


def {name}({ins}):
    _dev = {"in0.device" if match.inputs else "torch.device('cuda')"}
    {"".join(f"in{k} = in{k}.contiguous(); " for k in range(len(match.inputs)))}
    outs = ({", ".join(outs)},)
    {name}_kernel[(_cdiv({numel}, {block}),)]({ins}{", " if ins else ""}*outs, BLOCK={block},
        num_warps={config["num_warps"]})
    return outs
'''


def load_type(node: fx.Node) -> str:
    dt = dtype(node)
    if dt in (torch.float16, torch.bfloat16, torch.float32):
        return "tl.float32"
    return TL_DTYPES.get(dt, "tl.float32")
