"""A GEMM whose output rows are reduced in the same kernel: softmax, log-softmax, logsumexp, a sum, max or mean over
the product's last dim (a router's softmax over its experts, a logsumexp over a few hundred classes).

Where a row of the product fits one tile (N <= MAX_N), each program computes BLOCK_M whole rows of ``A @ B`` in
registers, then runs the row-reduction family's code on them, its product input bound to the accumulator instead of
loaded: the product is never written, and the reduction never reads it back. A product wider than one tile is left
to the plain GEMM and row-reduction families, two kernels.
"""
from __future__ import annotations

from typing import Any

import torch.fx as fx

from kernelevolve.analyze.graph import CapturedGraph, dtype, op_name, shape
from kernelevolve.templates.base import HopelessConfig, Match, make_match
from kernelevolve.templates.graphutil import pow2
from kernelevolve.templates.matmul.kernels import SPLIT_TF32X3_FP32SUM, epilogue_lines, indent, k_steps, precision_args, \
    split_text, upcast_flag
from kernelevolve.templates.matmul.launch import IEEE_LONG, SMEM_BYTES, SMS, WGMMA_ROWS, first_choice, itemsize_of, \
    launch_strides, precisions, prep_text, split_mode, splittable
from kernelevolve.templates.matmul.operands import gemm_parts, is_gemm, operand
from kernelevolve.templates.matmul.stage import Head, Stage, StageBuilder
from kernelevolve.templates.rowreduce.render import RowGen, store_output
from kernelevolve.templates.rowreduce.frame import Frame
from kernelevolve.templates.rowreduce.template import RowReduceTemplate

MAX_N = 1024  # widest product row kept in registers
MIN_ROWS = 1024  # fewer rows leave most SMs idle with one program per BLOCK_M rows: the two kernels do better
ROW_VIEWS = ("view", "_unsafe_view", "reshape")
# fp32 accumulator values a thread holds at most: the reduction's temporaries (the exp of the row, say) need room too
ACC_PER_THREAD = 64
# Hopper's warpgroup MMA (wgmma) takes 64 rows a warpgroup; a thinner tile falls back to mma.sync, at about half the
# tensor-core rate. A 64-row tile of 16-bit operands may hold twice the budget to get there: at 64 x 512 on 8 warps,
# softmax and logsumexp compile to wgmma without spills. Not fp32 operands: on the H200 (triton 3.6) a 64 x 512 fp32
# tile on 8 warps spilled (Triton's n_spills: IEEE 76, tf32x3 428, split_tf32x3 1222) and ran 1.2-12x slower than
# 32 rows (GEMM + logsumexp, 16384 x 1024 x 512: split_tf32x3 7.15 ms at 64 rows, 0.59 ms at 32; bench/tile_probe.py).
ACC_WGMMA = 128


def acc_budget(block_m: int, dot: str) -> int:
    """Accumulator values a thread may hold with a tile of ``block_m`` rows whose products run on ``dot``."""
    return ACC_WGMMA if block_m == WGMMA_ROWS and dot != "tl.float32" else ACC_PER_THREAD


class GemmReduceTemplate:
    """``reduce_rows(epilogue(A @ B + bias))`` in one kernel, for a product whose rows fit one tile."""

    family = "matmul_reduction"
    kind = "matmul_reduction"

    def find(self, graph: CapturedGraph, taken: set[fx.Node]) -> list[Match]:
        found, used = [], set(taken)
        for g in graph.calls():
            if g in used or not is_gemm(g, used) or op_name(g) not in ("mm", "addmm"):
                continue
            m, n = shape(g)
            if n > MAX_N or m < MIN_ROWS:
                continue
            match = self.claim(graph, g, used)
            if match is not None:
                found.append(match)
                used |= set(match.nodes)
        return found

    def claim(self, graph: CapturedGraph, g: fx.Node, used: set[fx.Node]) -> Match | None:
        a_node, b_node, *_ = gemm_parts(g)
        a = operand(a_node, {g}, used)
        b = operand(b_node, {g, *a.nodes}, used)
        # views that only split the product's rows (a Linear over [B, S, D], reshaped back) stand for the product
        chain, v = [], g
        while len(v.users) == 1 and op_name(next(iter(v.users))) in ROW_VIEWS:
            u = next(iter(v.users))
            if shape(u)[-1] != shape(g)[-1] or u in used:
                break
            chain.append(u)
            v = u
        base = {g, *a.nodes, *b.nodes, *chain}
        region = next((r for r in RowReduceTemplate().find(graph, used | base)
                       if v in r.inputs and r.kind == "row_reduction" and tuple(r.spec["full"]) == shape(v)), None)
        if region is None or not set(v.users) <= set(region.nodes):
            return None
        sb = StageBuilder("s0", a, [Head(g, g, b)])
        st = sb.build([])
        if st.dot == "tl.float32" and st.sizes["K"] > IEEE_LONG:
            return None  # unsplit fp32 running sums this long miss fp32's tolerance: the split-K GEMM's case
        match = make_match(self.family, [*base, *region.nodes], kind=self.kind)
        if match is None or set(match.outputs) != set(region.outputs):
            return None
        match.spec = {"stages": [st], "product": sb.env[g], "view": v.name, "rows": [n.name for n in region.nodes],
                      "full": region.spec["full"], "dim": region.spec["dim"], "squeezed": region.spec["squeezed"]}
        return match

    def space(self, match: Match, device: str) -> dict[str, list[Any]]:
        st = match.spec["stages"][0]
        m, k = st.sizes["M"], st.sizes["K"]
        bn = max(16, pow2(st.sizes["N"]))
        fits = [bm for bm in (128, 64, 32, 16) if bm * bn <= acc_budget(bm, st.dot) * 32 * 8]
        # the largest block of rows that still gives every SM a program, with 8 warps at the tile's register budget
        bm = next((x for x in fits if -(-m // x) >= SMS), fits[-1])
        ieee = st.dot == "tl.float32"
        space = {"BLOCK_M": first_choice(bm, fits), "BLOCK_K": first_choice(32 if ieee or k <= 32 else 64, [64, 32, 128]),
                 "num_warps": [8, 4], "num_stages": [3, 4, 2]}
        modes = precisions(st.dot, match.spec.get("allow_tf32", False), splittable(st), k)
        return {**space, "INPUT_PRECISION": modes} if modes else space

    def render(self, match: Match, config: dict[str, Any], name: str) -> str:
        config = {**{k: v[0] for k, v in self.space(match, "cuda").items()}, **config}
        st = match.spec["stages"][0]
        mode, split = split_mode(config, st)
        cfg = dict(_fit(config, st.sizes, st.dot, itemsize_of(st.dot) * (2 if split else 1),
                        int(split == SPLIT_TF32X3_FP32SUM)), SPLIT=split)
        rows = {n.name: n for n in match.nodes}
        sub = make_match("row_reduction", [rows[x] for x in match.spec["rows"]],
                         {"squeezed": match.spec["squeezed"]})
        view = next(n for n in sub.inputs if n.name == match.spec["view"])
        gen = RowGen(sub, Frame(tuple(match.spec["full"]), match.spec["dim"]), bound={view: match.spec["product"]})
        gen.merge()
        ins = [f"x_{n.name}" for n in match.inputs]
        parts = [_kernel(name, st, gen, sub, precision_args(st.dot, mode), split),
                 upcast_flag(name, f"{name}_kernel"),
                 prep_text(name, st, ins, stores=False), _launcher(name, match, st, gen, sub, cfg)]
        if split:
            parts.insert(2, split_text(name))
        return "\n\n\n".join(parts) + "\n"


def _fit(config: dict[str, Any], sizes: dict[str, int], dot: str, itemsize: int, sums: int = 0) -> dict[str, Any]:
    """``sums``: tiles of fp32 partial sums held beside the accumulator (SPLIT_TF32X3_FP32SUM's one), paid for with
    fewer rows where the rows allow."""
    bn = max(16, pow2(sizes["N"]))
    bm = min(config["BLOCK_M"], max(16, pow2(sizes["M"])))
    bk = min(config["BLOCK_K"], max(16, pow2(sizes["K"])))
    warps, stages = config["num_warps"], config["num_stages"]
    while sums and bm > 16 and (1 + sums) * bm * bn > acc_budget(bm, dot) * 32 * warps:
        bm //= 2
    if (1 + sums) * bm * bn > acc_budget(bm, dot) * 32 * warps:
        per_thread = (1 + sums) * bm * bn // (32 * warps)
        raise HopelessConfig(f"a {bm} x {bn} product tile on {warps} warps holds {per_thread} accumulators and "
                             "partial sums per thread")
    while stages > 2 and stages * (bm + bn) * bk * itemsize > SMEM_BYTES:
        stages -= 1
    while bk > 16 and stages * (bm + bn) * bk * itemsize > SMEM_BYTES:
        bk //= 2
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": stages}


def _kernel(name: str, st: Stage, gen: RowGen, sub: Match, prec: str, split: str = "") -> str:
    lo = ["", "_lo"] if split else [""]  # the rest after the TF32 part of a split operand, in the same layout
    ptrs = [f"{v}{s}_ptr" for s in lo for v in ("a", "b0")] + [f"{e.var}_ptr" for e in st.extras]
    ptrs += [f"{o.var}_ptr" for o in gen.loads.values()] + [f"{o.var}_ptr" for o in gen.outs]
    strides = ["s_am", "s_ak", "s_b0k", "s_b0n"] + [f"{e.var}_s{d}" for e in st.extras for d in e.dims]
    acc = st.accs[0]
    body = ["rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)", "rn = tl.arange(0, BLOCK_N)",
            "rk = tl.arange(0, BLOCK_K)"]
    # columns past N read wrapped data: finite, and never part of a reduction or a store (masked below)
    for s in lo:
        body += [f"a{s}_ptrs = a{s}_ptr + (rm % M)[:, None] * s_am + rk[None, :] * s_ak",
                 f"b0{s}_ptrs = b0{s}_ptr + rk[:, None] * s_b0k + (rn % N)[None, :] * s_b0n"]
    body += [f"{acc} = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)", "for k in range(0, tl.cdiv(K, BLOCK_K)):"]
    body += indent(k_steps(st, prec, "BLOCK_K", split), 1)
    body += ["mask_m = rm < M", "mask_n = rn < N", "mask = mask_m[:, None] & mask_n[None, :]"]
    body += epilogue_lines(st, stores=False)
    # the row reduction over whole rows of the product, in the row-reduction family's names
    body += ["rows = rm64[:, None]", "rmask = rows < M", "cols = rn[None, :]", "cmask = cols < N"]
    env: dict[fx.Node, str] = {}
    lines: list[str] = []
    gen.ensure(list(sub.outputs), env, "", lines, set())
    body += lines + [store_output(gen, k, n, env, "") for k, n in enumerate(sub.outputs)]
    head = [f"def {name}_kernel({', '.join(ptrs + ['M', 'N', 'K'] + strides)},",
            "        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr,",
            "        BLOCK_C: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr):"]
    return "\n".join(["@triton.jit"] + head + indent(body, 1))


def _launcher(name: str, match: Match, st: Stage, gen: RowGen, sub: Match, cfg: dict[str, Any]) -> str:
    ins = [f"x_{n.name}" for n in match.inputs]
    loads = [f"x_{node.name}.contiguous()" for node, _ in gen.loads]
    outs = ", ".join(f"torch.empty({list(shape(n))!r}, dtype={dtype(n)}, device=a.device)" for n in sub.outputs)
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    extra_strides = "".join(f"{s}, " for s in launch_strides(st))
    return "\n".join([
        f"def {name}(*inputs):", f"    {', '.join(ins)}, = inputs", f"    a = {st.a.expr}",
        f"    b0 = {st.bs[0].expr}", "    M, K = a.shape", "    N = b0.shape[1]",
        "    if tuple(b0.shape) != (K, N):",
        f"        raise ValueError(f'{name}: cannot multiply {{tuple(a.shape)}} by {{tuple(b0.shape)}}')",
        f"    e, _, _ = {name}_s0_prep(1, M, N, a.device, {', '.join(ins)})",
        f"    outs = ({outs},)",
        *([f"    a, a_lo = {name}_split(a)", f"    b0, b0_lo = {name}_split(b0)"] if cfg["SPLIT"] else []),
        f"    {name}_kernel[(_cdiv(M, {bm}),)](a, b0, {'a_lo, b0_lo, ' if cfg['SPLIT'] else ''}*e, "
        f"{''.join(x + ', ' for x in loads)}*outs, M, N, K, "
        f"*a.stride(), *b0.stride(), {extra_strides}",
        f"        BLOCK_M={bm}, BLOCK_N={bn}, BLOCK_K={bk}, BLOCK_R={bm}, BLOCK_C={bn}, EVEN_K=K % {bk} == 0,",
        f"        UPCAST={name}_UPCAST, num_warps={cfg['num_warps']}, num_stages={cfg['num_stages']})",
        "    return outs"])
