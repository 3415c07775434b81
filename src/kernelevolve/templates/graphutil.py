"""Graph helpers shared by the template families: ATen arguments by name, view chains and the strides they make,
values computed from constants alone."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from kernelevolve.analyze.graph import op_name, shape
from kernelevolve.analyze.pointwise import can_emit

# The ATen ops that move no values, by what they do; each family takes the union it can follow.
RESHAPES = {"view", "_unsafe_view", "reshape"}
SAME = {"alias", "clone", "contiguous", "detach", "lift_fresh_copy"}  # the same values, maybe a fresh buffer
DIM_OPS = RESHAPES | SAME | {"permute", "transpose", "t", "unsqueeze", "squeeze", "expand"}
VIEW_OPS = DIM_OPS - {"lift_fresh_copy"}  # what view_chain walks through
CASTS = {"_to_copy", "convert_element_type"}


def bind(node: fx.Node) -> dict[str, Any]:
    """Arguments of an ATen call by schema name, defaults filled in."""
    out = {}
    for i, a in enumerate(node.target._schema.arguments):
        if i < len(node.args):
            out[a.name] = node.args[i]
        else:
            out[a.name] = node.kwargs.get(a.name, a.default_value if a.has_default_value() else None)
    return out


def is_view(node: Any) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and (op_name(node) in VIEW_OPS
                                                                          or whole_slice(node))


def whole_slice(node: Any) -> bool:
    """A slice that keeps all of its source (``ids[:, None]`` slices dim 0 whole before the unsqueeze): a view."""
    return (isinstance(node, fx.Node) and op_name(node) == "slice" and isinstance(node.args[0], fx.Node)
            and shape(node) == shape(node.args[0]))


def view_chain(node: fx.Node) -> tuple[fx.Node, list[fx.Node]]:
    """The first non-view ancestor of ``node`` and the views from it to ``node`` (in graph order)."""
    chain = []
    while is_view(node):
        chain.append(node)
        node = node.args[0]
    return node, chain[::-1]


def view_map(chain: list[fx.Node], root: fx.Node) -> tuple[tuple[int, ...], int] | None:
    """Strides and offset, in elements of a contiguous ``root``, of the view that ``chain`` makes of it; None when
    a step copies (a ``reshape`` that cannot be a view). Worked out on the meta device: no data is touched."""
    env: dict[fx.Node, Any] = {root: torch.empty(shape(root), device="meta")}
    sub = lambda a: env[a] if isinstance(a, fx.Node) else a  # noqa: E731
    for n in chain:
        name = op_name(n)
        if name in ("clone", "contiguous", "alias", "detach"):
            env[n] = env[n.args[0]]
            continue
        args = torch.utils._pytree.tree_map(sub, n.args)
        kwargs = torch.utils._pytree.tree_map(sub, n.kwargs)
        try:
            env[n] = args[0].view(args[1]) if name in ("reshape", "_unsafe_view") else n.target(*args, **kwargs)
        except RuntimeError:
            return None
    out = env[chain[-1]] if chain else env[root]
    return tuple(out.stride()), out.storage_offset()


def const_value(node: Any, gm: fx.GraphModule, memo: dict | None = None) -> Any:
    """The value of a node computed from constants alone (``arange``, ``tril_indices``, lifted tensors), else None."""
    memo = {} if memo is None else memo
    if not isinstance(node, fx.Node):
        return node
    if node in memo:
        return memo[node]
    value = None
    if node.op == "get_attr":
        value = getattr(gm, node.target)
    elif node.op == "call_function":
        args = [const_value(a, gm, memo) for a in node.all_input_nodes]
        if all(isinstance(a, torch.Tensor) for a in args):
            env = dict(zip(node.all_input_nodes, args))
            sub = lambda a: env[a] if isinstance(a, fx.Node) else a  # noqa: E731
            with torch.no_grad():
                value = node.target(*torch.utils._pytree.tree_map(sub, node.args),
                                    **torch.utils._pytree.tree_map(sub, node.kwargs))
    memo[node] = value
    return value


def ancestors_within(node: fx.Node, stop: set[fx.Node]) -> list[fx.Node]:
    """``node`` and its call ancestors (constants, views) up to the nodes in ``stop``."""
    seen, todo = [], [node]
    while todo:
        n = todo.pop()
        if n in seen or n in stop or n.op == "placeholder":
            continue
        seen.append(n)
        todo.extend(n.all_input_nodes)
    return seen


def closed(nodes: set[fx.Node], extra: list[fx.Node]) -> bool:
    """Whether every user of ``extra`` lies inside ``nodes``: they are computed only for the region."""
    return all(u in nodes for n in extra for u in n.users)


def pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


def broadcasts_to(node: fx.Node, full: tuple[int, ...]) -> bool:
    """``node``'s value broadcasts to ``full`` without growing it."""
    s = shape(node)
    return len(s) <= len(full) and all(a == b or a == 1 for a, b in zip(reversed(s), reversed(full)))


def feeding_prologue(src: Any, full: tuple[int, ...], used: set[fx.Node]) -> set[fx.Node]:
    """The pointwise ops that only feed ``src`` into a kernel (``x * mask`` before a scan, an activation before a pool),
    back to the inputs: ``src`` of the kernel's ``full`` shape, the values before it broadcast to it (a scale of one
    row, a scalar). A node read by anything outside would be a second output: only the chain stays."""
    region: set[fx.Node] = set()
    stack = [src]
    while stack:
        n = stack.pop()
        if (not isinstance(n, fx.Node) or n in used or n in region or n.op != "call_function"
                or not can_emit(n) or not broadcasts_to(n, full) or (n is src and shape(n) != full)
                or any(not broadcasts_to(a, full) for a in n.all_input_nodes)):
            continue
        if n is not src and any(u not in region and u not in used for u in n.users):
            continue
        region.add(n)
        stack.extend(n.all_input_nodes)
    inside = used | region
    return {n for n in region if all(u in inside for u in n.users)}
