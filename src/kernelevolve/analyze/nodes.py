"""What a node of a captured ATen graph is: its op's name, and the shape and dtype of its traced value."""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx


def op_name(node: fx.Node) -> str:
    """``aten.add.Tensor`` -> ``add``; ``operator.getitem`` -> ``getitem``."""
    t = node.target
    if t is operator.getitem:
        return "getitem"
    if isinstance(t, torch._ops.OpOverload):
        return t._schema.name.split("::")[-1]
    return getattr(t, "__name__", str(t))


def meta(node: Any) -> Any:
    """The traced value of a node: a (fake) tensor, a tuple of them, or a constant."""
    return node.meta.get("val") if isinstance(node, fx.Node) else node


def shape(node: Any) -> tuple[int, ...]:
    v = meta(node)
    return tuple(int(s) for s in v.shape) if isinstance(v, torch.Tensor) else ()


def dtype(node: Any) -> torch.dtype | None:
    v = meta(node)
    return v.dtype if isinstance(v, torch.Tensor) else None
