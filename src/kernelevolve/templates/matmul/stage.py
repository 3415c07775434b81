"""The stage description (plain data): what one GEMM stage renders to, and the one-stage match built from it."""
from __future__ import annotations

from dataclasses import dataclass
import torch
import torch.fx as fx

from kernelevolve.analyze.graph import dtype, op_name, shape, tensor_args
from kernelevolve.analyze.pointwise import TL_DTYPES, compute_dtype, emit
from kernelevolve.templates.base import Match, make_match
from kernelevolve.templates.matmul.operands import (VIEWS, Operand, numel_of, as_tuple, feeding_casts, gemm_parts, grow,
                                                    half_source, operand)


@dataclass(frozen=True)
class Side:
    """A product operand as the launcher reads it: its expression over the inputs, and the dtype the kernel casts its
    tiles to (None where the dot takes them as loaded)."""
    expr: str
    cast: str | None


@dataclass(frozen=True)
class Extra:
    """An epilogue operand: kernel variable ``var``, launcher expression ``expr`` (viewed as [Bt, M, N]), the dims
    among b, m, n it varies along, and the Triton type it is computed in."""
    var: str
    expr: str
    dims: str
    type: str


@dataclass(frozen=True)
class Store:
    """An output: its launcher name, the kernel value stored, its shape expression and torch dtype."""
    name: str
    var: str
    shape: str
    dtype: str


@dataclass
class Stage:
    """What one GEMM stage renders to: the product ``a`` @ each of ``bs`` into accumulators ``accs`` (in ``dot``'s
    type), the epilogue ``lines`` over them and the ``extras``, and the ``stores`` of its outputs."""
    tag: str
    batched: bool
    dot: str
    sizes: dict[str, int]  # Bt, M, N, K
    a: Side
    bs: list[Side]
    accs: list[str]
    extras: list[Extra]
    lines: list[str]
    stores: list[Store]


@dataclass
class Head:
    value: fx.Node  # the node whose value is this accumulator (the GEMM, or a getitem of its split)
    gemm: fx.Node
    b: Operand
    chunk: int | None = None  # which half of a split product this head is


class StageBuilder:
    """Collects what one GEMM stage renders to: operand expressions, epilogue lines, extra operands, stores."""

    def __init__(self, tag: str, a: Operand, heads: list[Head], casts: set[fx.Node] | frozenset = frozenset()):
        self.tag, self.a, self.heads, self.casts = tag, a, heads, casts
        g = heads[0].gemm
        self.batched = op_name(g) in ("bmm", "baddbmm")
        a_shape, b_shape = shape(gemm_parts(g)[0]), shape(gemm_parts(g)[1])
        n = b_shape[-1] // (2 if heads[0].chunk is not None else 1)
        self.sizes = {"Bt": a_shape[0] if self.batched else 1, "M": a_shape[-2], "N": n, "K": a_shape[-1]}
        self.canon = (self.sizes["Bt"], self.sizes["M"], n)
        self.env: dict[fx.Node, str] = {}
        self.lines: list[str] = []
        self.extras: list[Extra] = []
        self.extra_nodes: set[fx.Node] = set()
        self._extra_var: dict[tuple, str] = {}
        self.narrow = half_source([a] + [h.b for h in heads])
        self.dot = TL_DTYPES[self.narrow or dtype(g)]
        self._heads()

    def shape_expr(self, s: tuple[int, ...]) -> str:
        _, m, n = self.canon
        if s == (tuple(self.canon) if self.batched else (m, n)):
            return "(Bt, M, N)" if self.batched else "(M, N)"
        if self.a.lead and s == tuple(self.a.lead[1]) + (n,):
            return f"(*{self.a.lead[0]}, N)"
        return as_tuple(s)

    def _extra(self, node: fx.Node, target: tuple[int, ...], target_expr: str, chunk: int | None = None) -> str:
        key = (node, target, chunk)
        if key in self._extra_var:
            return self._extra_var[key]
        casts = []
        while node in self.casts:
            casts.insert(0, node)
            node = node.args[0]
        var = f"{self.tag}_e{len(self.extras)}"
        meta = torch.empty_strided(shape(node), node.meta["val"].stride(), device="meta").expand(target)
        expr = f"x_{node.name}.expand{target_expr}"
        if chunk is not None:
            meta, expr = meta.chunk(2, -1)[chunk], f"{expr}.chunk(2, -1)[{chunk}]"
        strides = meta.reshape(self.canon).stride()
        dims = "".join(d for d, s in zip("bmn", strides) if s != 0 and (d != "b" or self.batched))
        self.extras.append(Extra(var, f"{expr}.reshape(Bt, M, N)", dims, compute_dtype(dtype(node))))
        self.extra_nodes.add(node)
        if casts:  # the loaded tensor converted as the graph's casts do (rounded where one narrows)
            var = emit(casts, {node: var}, self.lines, prefix=f"{var}_c")[casts[-1]]
        self._extra_var[key] = var
        return var

    def _heads(self) -> None:
        for j, h in enumerate(self.heads):
            acc = f"{self.tag}_acc{j}"
            _, _, bias, alpha, beta = gemm_parts(h.gemm)
            if bias is None and alpha == 1.0:
                self.env[h.value] = acc
                continue
            val = f"{acc} * {float(alpha)!r}" if alpha != 1.0 else acc
            if bias is not None and beta != 0:
                full = self.canon if self.batched else self.canon[1:]
                full_expr = "(Bt, M, N)" if self.batched else "(M, N)"
                if h.chunk is not None:
                    full = full[:-1] + (2 * full[-1],)
                    full_expr = full_expr[:-2] + "2 * N)"
                e = self._extra(bias, full, full_expr, h.chunk)
                val = f"{val} + {e} * {float(beta)!r}" if beta != 1.0 else f"{val} + {e}"
            self.lines.append(f"{self.tag}_h{j} = {val}")
            self.env[h.value] = f"{self.tag}_h{j}"

    def epilogue(self, nodes: list[fx.Node]) -> None:
        for i, u in enumerate(nodes):
            if op_name(u) in VIEWS:
                self.env[u] = self.env[u.args[0]]
                continue
            local = dict(self.env)  # an extra is named for the broadcast its consumer gives it
            for a in tensor_args(u):
                if a not in self.env:
                    local[a] = self._extra(a, shape(u), self.shape_expr(shape(u)))
            self.env[u] = emit([u], local, self.lines, prefix=f"{self.tag}_v{i}_")[u]

    def build(self, stores: list[fx.Node]) -> Stage:
        cast = (lambda c: None) if self.narrow else (lambda c: c)
        return Stage(self.tag, self.batched, self.dot, self.sizes, Side(self.a.expr, cast(self.a.cast)),
                     [Side(h.b.expr + (f".chunk(2, -1)[{h.chunk}]" if h.chunk is not None else ""), cast(h.b.cast))
                      for h in self.heads],
                     [f"{self.tag}_acc{j}" for j in range(len(self.heads))], self.extras, self.lines,
                     [Store(f"x_{o.name}", self.env[o], self.shape_expr(shape(o)), str(dtype(o))) for o in stores])


def finish(family: str, kind: str, base: set[fx.Node], epi: list[fx.Node], a: Operand,
           heads: list[Head], taken: set[fx.Node]) -> Match | None:
    """One-stage match over ``base`` + ``epi`` (and the casts feeding them), or None when it is not convex or leaves
    a value without a name."""
    casts = feeding_casts(base | set(epi), [a] + [h.b for h in heads], taken)
    match = make_match(family, list(base) + epi + casts, {}, kind)
    if match is None:
        return None
    sb = StageBuilder("s0", a, heads, set(casts))
    sb.epilogue(epi)
    if any(o not in sb.env for o in match.outputs) or not sb.extra_nodes <= set(match.inputs):
        return None
    match.spec = {"stages": [sb.build(match.outputs)]}
    return match


def single(family: str, kind: str, node: fx.Node, taken: set[fx.Node]) -> tuple[Match | None, Operand, list]:
    a_node, b_node = gemm_parts(node)[:2]
    a = operand(a_node, {node}, taken)
    b = operand(b_node, {node, *a.nodes}, taken)
    base = {node, *a.nodes, *b.nodes}
    epi = grow(base, numel_of(shape(node)), taken)
    return finish(family, kind, base, epi, a, [Head(node, node, b)], taken), a, epi
