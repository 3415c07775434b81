"""The attention family's template: the region from the second bmm upwards, its search space and its kernel."""
from __future__ import annotations

import logging
from typing import Any

import torch.fx as fx

from kernelevolve.analyze import pointwise
from kernelevolve.analyze.graph import CapturedGraph, op_name, shape
from kernelevolve.templates.attention.region import (OUT_OPS, climb, dim_maps, NoMatch, operand_op, out_layout_of,
                                                     p_chain_ok, prune_region, Region, s_dims, softmax_scale, score_graph,
                                                     softmax_of)
from kernelevolve.templates.attention.render import clamp, helper_source, kernel_source, launch_config, launcher_source
from kernelevolve.templates.graphutil import CASTS, DIM_OPS, SAME
from kernelevolve.templates.attention.spec import probe_spec, spec_of
from kernelevolve.templates.base import Match, claim_each, make_match

log = logging.getLogger(__name__)


def _match(graph: CapturedGraph, pv: fx.Node, used: set[fx.Node]) -> Match:
    zmn = shape(pv.args[0])
    reg = Region(pv)
    pchain = climb(pv.args[0], used, lambda x: op_name(x) in DIM_OPS | CASTS)
    end, reg.pchain = pchain[0], pchain[1:]
    if end.op != "call_function" or end in used:
        raise NoMatch("no weights computed before bmm(p, v)")
    found = softmax_of(end)
    if found is not None:
        reg.x, reg.softmax, reg.zero_empty, kd = found
    elif pointwise.is_pointwise(end):
        reg.mode, reg.x, kd = "pointwise", end, None
    else:
        raise NoMatch("neither softmax nor elementwise weights")
    score_graph(reg, used, zmn)
    if reg.mode == "pointwise" and all(softmax_scale(n) or op_name(n) in CASTS | SAME for n in reg.main):
        raise NoMatch("a plain chain of matmuls")
    dims = s_dims(reg, *zmn, kd)
    s_shape, s_strides, qdim, kdim, _ = dims
    if (kd is not None and kd % len(s_shape) != kdim) or list(shape(reg.x)) != s_shape:
        raise NoMatch("softmax over another dim than the keys")
    if not p_chain_ok(reg, s_shape, s_strides, zmn):
        raise NoMatch("the weights reach bmm(p, v) reordered")
    ok = operand_op
    reg.chains = {"q": climb(reg.qk.args[0], used, ok), "k": climb(reg.qk.args[1], used, ok),
                  "v": climb(pv.args[1], used, ok)}
    down, node = [], pv
    while len(node.users) == 1:
        node = next(iter(node.users))
        if node.op != "call_function" or node in used or op_name(node) not in OUT_OPS:
            break
        down.append(node)
    cut = next(c for c in range(len(down), -1, -1) if c == 0 or out_layout_of(down[:c], pv) is not None)
    reg.out = down[:cut]
    out_layout = out_layout_of(reg.out, pv)
    if out_layout is None:
        raise NoMatch("cannot write the output through strides")
    prune_region(reg)
    dm = dim_maps(reg, len(s_shape))
    band, consts = probe_spec(graph, reg, s_shape, qdim, kdim)
    match = make_match("attention", reg.nodes(), kind="attention")
    if match is None or match.outputs != [reg.out[-1] if reg.out else pv]:
        raise NoMatch("the region is not convex or leaks an intermediate")
    match.spec = spec_of(reg, match, dims, dm, band, consts, out_layout)
    return match



class AttentionTemplate:
    """Flash attention over a matched bmm -> scores -> (softmax) -> bmm region."""

    family = "attention"

    def find(self, graph: CapturedGraph, taken: set[fx.Node]) -> list[Match]:
        def claim(pv: fx.Node, used: set[fx.Node]) -> Match | None:
            if op_name(pv) != "bmm":
                return None
            try:
                return _match(graph, pv, used)
            except NoMatch as e:
                log.debug("attention at %s: %s", pv.name, e)
                return None

        return claim_each(graph, taken, claim)

    def space(self, match: Match, device: str) -> dict[str, list[Any]]:
        # H200, B=4 S=2048: bf16 D=64 is best at 128x64 with 4 warps (0.125 ms causal); D=128 at 64x64 with 4 warps
        # (0.183 ms against 0.198 for 128x64 with 8); fp32 (FMA dots) at 64x64 with 4 warps (0.63 ms), while 128x64
        # with 4 warps spills (12 ms).
        _, m, n, d, dv = match.spec["sizes"]
        small = match.spec["qk_dtype"] != "tl.float32" and max(d, dv) <= 64
        return {"BLOCK_M": list(dict.fromkeys(clamp(b, m) for b in ((128, 64) if small else (64, 128)))),
                "BLOCK_N": list(dict.fromkeys(clamp(b, n) for b in (64, 128, 32))),
                "num_warps": [4, 8],
                "num_stages": [3, 2, 4] if match.spec["qk_dtype"] != "tl.float32" else [2, 3, 4]}

    def render(self, match: Match, config: dict[str, Any], name: str) -> str:
        cfg = launch_config(match.spec, config)
        return "\n\n".join([helper_source(name), kernel_source(match.spec, name), launcher_source(match.spec, name, cfg)])
