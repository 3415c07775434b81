"""The frame a row-reduction region lives in: the full shape F, the reduced dim d, and the shapes a value may take;
shared by the family (which claims regions) and its code generator."""
from __future__ import annotations

import torch
import torch.fx as fx

from kernelevolve.analyze.graph import op_name, shape
from kernelevolve.templates.graphutil import RESHAPES

REDUCTIONS = {"sum": "0.0", "amax": "float('-inf')", "amin": "float('inf')"}
VIEWS = RESHAPES | {"unsqueeze", "squeeze", "expand"}  # views that only add or drop the reduced dim
MAX_TILE = 16384  # elements per [BLOCK_R, BLOCK_C] tile before a persistent row stops fitting in registers


def reduced_dim(node: fx.Node) -> int | None:
    if node.op != "call_function" or op_name(node) not in REDUCTIONS or len(node.args) < 2:
        return None
    dims = node.args[1] if isinstance(node.args[1], (list, tuple)) else [node.args[1]]
    src = shape(node.args[0])
    if len(dims) != 1 or not src or not torch.is_floating_point(node.args[0].meta["val"]):
        return None
    return dims[0] % len(src)


def keepdim(node: fx.Node) -> bool:
    return bool(node.args[2]) if len(node.args) > 2 else bool(node.kwargs.get("keepdim", False))


class Frame:
    """F, the reduced dim d, and what shape a value may have in this region."""

    def __init__(self, full: tuple[int, ...], d: int):
        self.full, self.d = full, d
        self.scal = full[:d] + (1,) + full[d + 1:]
        self.sq = full[:d] + full[d + 1:]

    def trim(self, s: tuple[int, ...]) -> tuple[int, ...]:
        """``s`` without the trailing unit dims past the frame's rank: [N, G, C, 1] is [N, G, C] in memory (GroupNorm's
        decomposition works in such a frame). Other shapes are returned as they are."""
        s = tuple(s)
        while len(s) > len(self.full) and s[-1] == 1:
            s = s[:-1]
        return s

    def extended(self, s: tuple[int, ...]) -> bool:
        """Whether ``s`` carries trailing unit dims past the frame's rank."""
        return len(s) > len(self.full) and len(self.trim(s)) == len(self.full)

    def fits(self, s: tuple[int, ...]) -> bool:
        s = self.trim(s)
        return len(s) <= len(self.full) and all(a in (b, 1) for a, b in zip(reversed(s), reversed(self.full)))

    def fits_sq(self, s: tuple[int, ...]) -> bool:
        return len(s) <= len(self.sq) and all(a in (b, 1) for a, b in zip(reversed(s), reversed(self.sq)))

    def in_full(self, s: tuple[int, ...], squeezed: bool) -> tuple[int, ...]:
        """A shape as it broadcasts in F (rank len(F)), read in the squeezed frame when ``squeezed``."""
        if squeezed:
            s = (1,) * (len(self.sq) - len(s)) + tuple(s)
            return s[:self.d] + (1,) + s[self.d:]
        s = self.trim(s)
        return (1,) * (len(self.full) - len(s)) + tuple(s)
