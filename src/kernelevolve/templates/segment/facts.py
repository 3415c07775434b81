"""Facts about 1-D index tensors, derived over the graph however they are spelled: which node is a shifted view of
another (slices, pads), and which holds the differences of consecutive offsets (the bags' lengths), whether written
``offsets[1:] - offsets[:-1]``, ``torch.diff(offsets)`` or ``(offsets - F.pad(offsets, (1, 0))[:-1])[1:]``."""
from __future__ import annotations

from dataclasses import dataclass

import torch.fx as fx

from kernelevolve.analyze.graph import op_name, shape
from kernelevolve.templates.graphutil import bind, const_value


@dataclass(frozen=True)
class Shifted:
    """``node[j] == base[j + shift]`` for every j >= lo (below lo: a pad's fill)."""

    base: fx.Node
    shift: int
    lo: int
    nodes: tuple[fx.Node, ...]  # the slices and pads from base to the node


@dataclass(frozen=True)
class Diff(Shifted):
    """``node[j] == base[j + shift + 1] - base[j + shift]`` for every j >= lo (``nodes``: the subtraction and the
    views under and over it)."""


def _slice_start(node: fx.Node) -> int | None:
    """Where a unit-step 1-D slice starts in its source; None for any other slice."""
    b = bind(node)
    src = node.args[0]
    if b["dim"] not in (0, -1) or len(shape(src)) != 1:
        return None
    kept = range(shape(src)[0])[b["start"]:b["end"]:b["step"]]
    return kept.start if kept.step == 1 else None


_SAME = {"view", "_unsafe_view", "reshape", "expand", "alias", "clone", "contiguous", "slice"}


def identity(node: fx.Node) -> bool:
    """A view or copy that leaves a tensor as it was (a size-1 ``repeat_interleave``'s view and expand of its repeats)."""
    return (op_name(node) in _SAME and isinstance(node.args[0], fx.Node) and shape(node) == shape(node.args[0])
            and len(shape(node)) == 1)


def shifted(node: fx.Node) -> Shifted:
    """The view of a 1-D tensor that ``node`` is, through unit-step slices and a leading constant pad."""
    name = op_name(node) if isinstance(node, fx.Node) else ""
    if name and identity(node):
        inner = shifted(node.args[0])
        return Shifted(inner.base, inner.shift, inner.lo, inner.nodes + (node,))
    if name == "slice" and len(shape(node)) == 1 and (start := _slice_start(node)) is not None:
        inner = shifted(node.args[0])
        return Shifted(inner.base, inner.shift + start, max(0, inner.lo - start), inner.nodes + (node,))
    if name == "constant_pad_nd" and len(shape(node)) == 1 and len(node.args[1]) == 2 and node.args[1][0] >= 0:
        inner = shifted(node.args[0])
        left = int(node.args[1][0])
        return Shifted(inner.base, inner.shift - left, inner.lo + left, inner.nodes + (node,))
    return Shifted(node, 0, 0, ())


def diff(node: fx.Node) -> Diff | None:
    """``node`` as differences of consecutive entries of one 1-D tensor, or None."""
    name = op_name(node) if isinstance(node, fx.Node) else ""
    if len(shape(node)) != 1:
        return None
    if name and identity(node):
        inner = diff(node.args[0])
        return None if inner is None else Diff(inner.base, inner.shift, inner.lo, inner.nodes + (node,))
    if name == "slice" and (start := _slice_start(node)) is not None:
        inner = diff(node.args[0])
        if inner is None:
            return None
        return Diff(inner.base, inner.shift + start, max(0, inner.lo - start), inner.nodes + (node,))
    if name != "sub" or len(node.args) != 2 or node.kwargs.get("alpha", 1) != 1 \
            or not all(isinstance(a, fx.Node) and shape(a) == shape(node) for a in node.args):
        return None
    hi, lo = shifted(node.args[0]), shifted(node.args[1])
    if hi.base is not lo.base or hi.shift != lo.shift + 1:
        return None
    return Diff(hi.base, lo.shift, max(hi.lo, lo.lo), hi.nodes + lo.nodes + (node,))


def lengths_of(node: fx.Node) -> tuple[fx.Node, tuple[fx.Node, ...]] | None:
    """(offsets, the nodes between) where ``node`` [B] is exactly ``offsets[1:] - offsets[:-1]`` for offsets [B + 1]:
    the bags' lengths, when the offsets hold the end of the last bag."""
    d = diff(node)
    if d is None or d.shift != 0 or d.lo != 0 or len(shape(d.base)) != 1 or shape(d.base)[0] != shape(node)[0] + 1:
        return None
    return d.base, tuple(dict.fromkeys(d.nodes))


def lengths_near(offsets: fx.Node, depth: int = 3) -> list[tuple[fx.Node, tuple[fx.Node, ...]]]:
    """Every node within ``depth`` uses of ``offsets`` that holds its lengths (lengths_of)."""
    seen, frontier, found = {offsets}, [offsets], []
    for _ in range(depth):
        nxt = []
        for n in frontier:
            for u in n.users:
                if u in seen:
                    continue
                seen.add(u)
                nxt.append(u)
                hit = lengths_of(u)
                if hit is not None and hit[0] is offsets:
                    found.append((u, hit[1]))
        frontier = nxt
    return found


def only_used_within(nodes: set[fx.Node], keep: fx.Node) -> bool:
    """Whether every user of every node of ``nodes`` but ``keep`` is itself in ``nodes``."""
    return all(u in nodes for n in nodes if n is not keep for u in n.users)


def lengths_summed(node: fx.Node, gm: fx.GraphModule) -> tuple[fx.Node, tuple[fx.Node, ...]] | None:
    """(lengths, the nodes between) where ``node`` [B + 1] is the offsets of bags of those lengths, a zero and then
    their running sum: ``torch.cat([zeros(1), lengths.cumsum(0)])`` or ``F.pad(lengths.cumsum(0), (1, 0))``."""
    name = op_name(node) if isinstance(node, fx.Node) else ""
    if len(shape(node)) != 1:
        return None
    if name == "constant_pad_nd" and list(node.args[1]) == [1, 0] and (len(node.args) < 3 or node.args[2] == 0):
        head, summed = (), node.args[0]
    elif name == "cat" and len(node.args[0]) == 2 and bind(node).get("dim", 0) in (0, -1):
        zero, summed = node.args[0]
        value = const_value(zero, gm)
        if value is None or value.numel() != 1 or float(value.reshape(-1)[0]) != 0:
            return None
        head = (zero,)
    else:
        return None
    if op_name(summed) != "cumsum" or bind(summed)["dim"] not in (0, -1) or len(shape(summed)) != 1:
        return None
    return summed.args[0], (*head, summed, node)
