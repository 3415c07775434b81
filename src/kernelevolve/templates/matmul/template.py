"""The matmul-shaped families. ``kernelevolve.templates.registry`` tries the bigger patterns before the plain GEMM."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from kernelevolve.analyze.graph import CapturedGraph, dtype, op_name, region_io, shape, tensor_args
from kernelevolve.templates.base import Match, claim_each, make_match
from kernelevolve.templates.graphutil import bind
from kernelevolve.templates.matmul.kernels import precision_args, fused_kernel, upcast_flag
from kernelevolve.templates.matmul.launch import (KNOBS, first_choice, itemsize_of, fit_fused, fused_launcher, gemm_space,
                                                  launcher_text, precisions, prep_text, render_gemm, splittable,
                                                  tensor_core_prior)
from kernelevolve.templates.matmul.operands import (CASTS, SPLITS, VIEWS, chainable, keeps_order, numel_of,
                                                    feeding_casts, gemm_parts, grow, is_gemm, operand)
from kernelevolve.templates.matmul.stage import Head, StageBuilder, finish, single

MAX_FUSED_H = 256  # widest tower intermediate kept in registers


def _reaches(start: fx.Node, goal: fx.Node, region: set[fx.Node]) -> bool:
    seen, todo = set(), [start]
    while todo:
        n = todo.pop()
        if n is goal:
            return True
        if n not in seen:
            seen.add(n)
            todo.extend(u for u in n.users if u in region)
    return False


class MatmulTemplate:
    """One GEMM (mm/addmm/bmm/baddbmm, nn.Linear) with its operand views and its pointwise epilogue."""

    family = "matmul"
    kind = "matmul"

    def find(self, graph: CapturedGraph, taken: set[fx.Node]) -> list[Match]:
        return claim_each(graph, taken, lambda n, used: self.claim(n, used) if is_gemm(n, used) else None)

    def claim(self, node: fx.Node, taken: set[fx.Node]) -> Match | None:
        return single(self.family, self.kind, node, taken)[0]

    def space(self, match: Match, device: str) -> dict[str, list[Any]]:
        st = match.spec["stages"][0]
        return gemm_space(st.sizes, st.dot, len(st.bs), match.spec.get("allow_tf32", False), splittable(st))

    def tensor_core_prior(self, match: Match, space: dict[str, list[Any]]) -> dict[str, Any]:
        """Knobs a tensor-core fp32 mode starts from, where the defaults serve the exact FMA dot."""
        st = match.spec["stages"][0]
        if st.dot != "tl.float32" or match.spec.get("allow_tf32", False):
            return {}
        return tensor_core_prior(st.sizes, len(st.bs), space)

    def render(self, match: Match, config: dict[str, Any], name: str) -> str:
        config = {**{k: v[0] for k, v in self.space(match, "cuda").items()}, **config}
        st = match.spec["stages"][0]
        parts = render_gemm(match, st, config, name)
        ins = [f"x_{n.name}" for n in match.inputs]
        parts.append(launcher_text(name, match, [(f"{name}_s0", ins, [s.name for s in st.stores])]))
        return "\n\n\n".join(parts) + "\n"


class CrossTemplate(MatmulTemplate):
    """A DCN-v2 cross layer, ``x0 * (x_l @ W^T + b) + x_l``: a square GEMM whose epilogue multiplies by an outside
    tensor and adds the GEMM's own input back."""

    family = "cross"
    kind = "dcn_cross"

    def claim(self, node: fx.Node, taken: set[fx.Node]) -> Match | None:
        match, a, epi = single(self.family, self.kind, node, taken)
        if match is None:
            return None
        a_node = gemm_parts(node)[0]
        inside = set(match.nodes)
        outer = lambda u: [x for x in tensor_args(u) if x not in inside]  # noqa: E731
        scaled = any(op_name(u) == "mul" and outer(u) for u in epi)
        residual = any(op_name(u) == "add" and {a.source, a_node} & set(outer(u)) for u in epi)
        return match if scaled and residual and shape(node)[-1] == shape(a_node)[-1] else None


class DualGemmTemplate(MatmulTemplate):
    """Two GEMMs on one A (``x @ W1^T``, ``x @ W3^T``, or the halves of one ``x @ W13^T``) that meet in one
    pointwise result, e.g. SwiGLU ``silu(a) * b``: one kernel, A read once, two accumulators."""

    family = "dual_gemm"
    kind = "dual_gemm"

    def find(self, graph: CapturedGraph, taken: set[fx.Node]) -> list[Match]:
        taken, found = set(taken), []
        gemms = [n for n in graph.calls() if is_gemm(n, taken)]
        # a cheap key first: only GEMMs reading the same tensor at the same shapes can share their A
        keys = {g: (operand(gemm_parts(g)[0], {g}, taken).source, shape(g), dtype(g)) for g in gemms}
        for i, node in enumerate(gemms):
            if node in taken:
                continue
            match = self.split(node, taken)
            for other in gemms[i + 1:]:
                if match is None and other not in taken and keys[other] == keys[node]:
                    match = self.pair(node, other, taken)
            if match is not None:
                found.append(match)
                taken |= set(match.nodes)
        return found

    @staticmethod
    def _one_output(match: Match | None, heads: list[fx.Node]) -> Match | None:
        if match is None or len(match.outputs) != 1:
            return None
        region = set(match.nodes)
        return match if all(_reaches(h, match.outputs[0], region) for h in heads) else None

    def pair(self, g0: fx.Node, g1: fx.Node, taken: set[fx.Node]) -> Match | None:
        batched = op_name(g0) in ("bmm", "baddbmm")
        if batched != (op_name(g1) in ("bmm", "baddbmm")) or shape(g0) != shape(g1) or dtype(g0) != dtype(g1):
            return None
        a0 = operand(gemm_parts(g0)[0], {g0, g1}, taken)
        a1 = operand(gemm_parts(g1)[0], {g0, g1}, taken)
        if a0.expr != a1.expr or a0.cast != a1.cast:
            return None
        b0 = operand(gemm_parts(g0)[1], {g0}, taken)
        b1 = operand(gemm_parts(g1)[1], {g1}, taken)
        base = {g0, g1, *a0.nodes, *a1.nodes, *b0.nodes, *b1.nodes}
        epi = grow(base, numel_of(shape(g0)), taken)
        match = finish(self.family, self.kind, base, epi, a0, [Head(g0, g0, b0), Head(g1, g1, b1)], taken)
        return self._one_output(match, [g0, g1])

    def split(self, node: fx.Node, taken: set[fx.Node]) -> Match | None:
        n_full, views, v = shape(node)[-1], [], node
        while len(v.users) == 1 and not set(v.users) & taken:
            u = next(iter(v.users))
            if op_name(u) not in VIEWS or not keeps_order(u) or shape(u)[-1] != n_full:
                break
            views.append(u)
            v = u
        if n_full % 2:
            return None
        found = _halves_by_slices(v, n_full, taken)
        if found is None:
            s = next(iter(v.users)) if len(v.users) == 1 else None
            if s is None or s in taken or op_name(s) not in SPLITS:
                return None
            dim = (s.args[2] if len(s.args) > 2 else 0) % len(shape(v))
            sizes = s.args[1] if isinstance(s.args[1], (list, tuple)) else [s.args[1]] * 2
            items = sorted(s.users, key=lambda g: g.args[1])
            if dim != len(shape(v)) - 1 or list(sizes) != [n_full // 2] * 2 or [g.args[1] for g in items] != [0, 1]:
                return None
            found = [s], items
        own, items = found
        a_node, b_node = gemm_parts(node)[:2]
        a = operand(a_node, {node}, taken)
        b = operand(b_node, {node, *a.nodes}, taken)
        base = {node, *views, *own, *items, *a.nodes, *b.nodes}
        epi = grow(base, numel_of(shape(items[0])), taken)
        heads = [Head(items[0], node, b, 0), Head(items[1], node, b, 1)]
        return self._one_output(finish(self.family, self.kind, base, epi, a, heads, taken), items)


def _halves_by_slices(v: fx.Node, n_full: int, taken: set[fx.Node]) -> tuple[list[fx.Node], list[fx.Node]] | None:
    """([], [first half, second half]) where ``v``'s only users are its two halves along the last dim, each a
    unit-step slice (``h[..., :n]``, ``h[..., n:]``), as ``chunk(2, -1)`` would give them."""
    users = [u for u in v.users if op_name(u) == "slice" and u not in taken]
    if len(users) != 2 or len(v.users) != 2:
        return None
    halves = {}
    for u in users:
        b = bind(u)
        if b["dim"] % len(shape(v)) != len(shape(v)) - 1 or b["step"] != 1:
            return None
        kept = range(n_full)[b["start"]:b["end"]]
        halves[(kept.start, kept.stop)] = u
    lo, hi = halves.get((0, n_full // 2)), halves.get((n_full // 2, n_full))
    return ([], [lo, hi]) if lo is not None and hi is not None else None


class BatchedSmallTemplate:
    """Multi-task towers: two chained batched layers ``act(X[t] @ W1[t] + b1[t]) @ W2[t] + b2[t]``, one launch over
    (tasks x row blocks); with FUSE the first layer's output (H <= 256 wide) never leaves registers."""

    family = "batched_matmul"
    kind = "batched_matmul"

    def find(self, graph: CapturedGraph, taken: set[fx.Node]) -> list[Match]:
        weights = set(graph.placeholders()[:len(graph.state_names)])
        return claim_each(graph, taken, lambda n, used: self.chain(n, used, weights)
                          if is_gemm(n, used) and op_name(n) in ("bmm", "baddbmm") else None)

    @staticmethod
    def _next_layer(hn: fx.Node, taken: set[fx.Node]) -> fx.Node | None:
        v = hn
        while len(v.users) == 1 and chainable(next(iter(v.users)), taken):
            v = next(iter(v.users))
        nxt = next(iter(v.users)) if len(v.users) == 1 else None
        if nxt is None or not is_gemm(nxt, taken) or op_name(nxt) not in ("bmm", "baddbmm"):
            return None
        return nxt if gemm_parts(nxt)[0] is v else None

    def chain(self, g0: fx.Node, taken: set[fx.Node], weights: set[fx.Node]) -> Match | None:
        a_node, b_node = gemm_parts(g0)[:2]
        a = operand(a_node, {g0}, taken)
        b = operand(b_node, {g0, *a.nodes}, taken)
        # towers multiply by the model's own per-task weights; two chained products of activations (q kᵀ, then the
        # weights times v) are attention's, whose kernel keeps the scores on chip at any sequence length
        if b.source not in weights:
            return None
        base0 = {g0, *a.nodes, *b.nodes}
        epi0 = grow(base0, numel_of(shape(g0)), taken)
        outs = region_io(list(base0) + epi0)[1]
        if len(outs) != 1:
            return None
        hn = outs[0]
        # the intermediate is kept in its half type: the up-cast before the second layer is done on the loaded tile
        while hn in epi0 and op_name(hn) in CASTS and dtype(hn) == torch.float32 and len(hn.args[0].users) == 1 \
                and dtype(hn.args[0]) in (torch.float16, torch.bfloat16) and hn.args[0] in epi0:
            epi0.remove(hn)
            hn = hn.args[0]
        region0 = list(base0) + epi0
        g1 = self._next_layer(hn, taken | set(region0))
        if g1 is None or shape(g0)[-1] > MAX_FUSED_H:
            return None
        a1 = operand(gemm_parts(g1)[0], {g1}, taken | set(region0))
        # views that keep the order, and expands that change nothing (matmul's broadcast of an already full batch)
        keeps = all(op_name(c) in CASTS or (op_name(c) in VIEWS and keeps_order(c))
                    or (op_name(c) == "expand" and shape(c) == shape(c.args[0])) for c in a1.nodes)
        if a1.source is not hn or not keeps or shape(gemm_parts(g1)[0]) != shape(g0):
            return None
        a1.lead = None
        b1 = operand(gemm_parts(g1)[1], {g1}, taken)
        base1 = set(region0) | {g1, *a1.nodes, *b1.nodes}
        epi1 = grow(base1, numel_of(shape(g1)), taken)
        casts = feeding_casts(base1 | set(epi1), [a, b, a1, b1], taken)
        match = make_match(self.family, list(base1) + epi1 + casts, {}, self.kind)
        if match is None:
            return None
        sb0 = StageBuilder("s0", a, [Head(g0, g0, b)], set(casts))
        sb0.epilogue(epi0)
        sb1 = StageBuilder("s1", a1, [Head(g1, g1, b1)], set(casts))
        sb1.epilogue(epi1)
        # the second layer's epilogue may read outside tensors only: the first layer's values live in registers
        if any(o not in sb1.env for o in match.outputs) or not sb0.extra_nodes | sb1.extra_nodes <= set(match.inputs):
            return None
        match.spec = {"stages": [sb0.build([hn]), sb1.build(match.outputs)], "intermediates": [f"x_{hn.name}"]}
        return match

    def space(self, match: Match, device: str) -> dict[str, list[Any]]:
        s0, s1 = (st.sizes for st in match.spec["stages"])
        dot = match.spec["stages"][0].dot
        bm = 64 if s0["M"] > 32 else 32
        bn = 128 if s1["N"] > 64 else (64 if s1["N"] > 32 else 32)
        bk = 32 if dot == "tl.float32" or s0["K"] <= 32 else 64
        # measured on an H200 (8 tasks, 4096 x 512 -> 256 -> 128): bf16 fused 0.26 ms, unfused 0.24 ms; fp32 fused
        # spills (8.3 ms against 0.27 ms), so fusing is the default only for narrow 16-bit intermediates
        fuse = dot != "tl.float32" and s0["N"] <= 128
        space = {"FUSE": [fuse, not fuse], "BLOCK_M": first_choice(bm, KNOBS["BLOCK_M"]),
                 "BLOCK_N": first_choice(bn, KNOBS["BLOCK_N"]), "BLOCK_K": first_choice(bk, KNOBS["BLOCK_K"]),
                 "num_warps": [4, 8], "num_stages": [3, 4, 2, 5]}
        # operands split in memory serve the unfused stages; the fused kernel renders tf32x3 for that mode
        modes = precisions(dot, match.spec.get("allow_tf32", False), all(map(splittable, match.spec["stages"])),
                           max(s["K"] for s in (s0, s1)))
        return {**space, "INPUT_PRECISION": modes} if modes else space

    def render(self, match: Match, config: dict[str, Any], name: str) -> str:
        config = {**{k: v[0] for k, v in self.space(match, "cuda").items()}, **config}
        s0, s1 = match.spec["stages"]
        ins = [f"x_{n.name}" for n in match.inputs]
        if not config["FUSE"]:
            cfg = {**config, "GROUP_M": 8, "SPLIT_K": 1}
            parts = render_gemm(match, s0, cfg, name) + render_gemm(match, s1, cfg, name)
            calls = [(f"{name}_s0", ins, match.spec["intermediates"]),
                     (f"{name}_s1", ins + match.spec["intermediates"], [s.name for s in s1.stores])]
            return "\n\n\n".join(parts + [launcher_text(name, match, calls)]) + "\n"
        cfg = fit_fused(config, s0.sizes, s1.sizes, itemsize_of(s0.dot))
        mode = config.get("INPUT_PRECISION", "ieee")
        parts = [fused_kernel(name, s0, s1, precision_args(s0.dot, mode), precision_args(s1.dot, mode)),
                 upcast_flag(name, f"{name}_kernel"),
                 prep_text(name, s0, ins, stores=False), prep_text(name, s1, ins),
                 fused_launcher(name, match, s0, s1, cfg)]
        return "\n\n\n".join(parts) + "\n"
