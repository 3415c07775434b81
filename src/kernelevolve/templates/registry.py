"""Every template family in one table, in the order the families claim regions of a graph: the bigger pattern wins.

The classes are imported here rather than named as strings, so a family that cannot be imported fails every caller
at once instead of dropping out of the search unnoticed. The template proposer claims regions in this order, and the
knowledge base takes its note vocabulary from the names.
"""
from __future__ import annotations

from dataclasses import dataclass

from kernelevolve.templates.attention import AttentionTemplate
from kernelevolve.templates.base import Template
from kernelevolve.templates.interaction import InteractionTemplate
from kernelevolve.templates.matmul import (BatchedSmallTemplate, CrossTemplate, DualGemmTemplate, GemmReduceTemplate,
                                           MatmulTemplate)
from kernelevolve.templates.pointwise import PointwiseTemplate
from kernelevolve.templates.pool import PoolTemplate
from kernelevolve.templates.rowreduce import RowReduceTemplate
from kernelevolve.templates.scan import ScanTemplate
from kernelevolve.templates.segment import SegmentTemplate


@dataclass(frozen=True)
class Family:
    """One family: its class and the facts about it that the proposer and the knowledge base read."""

    name: str  # the class's ``family``: what matches, stored configs and note front matter call it
    template: type[Template]
    # the region may also run as the plain ATen op (cuBLAS), and the search decides per region: worth it where the
    # library has a strong vendor kernel to lose to
    optional: bool = False


FAMILIES: tuple[Family, ...] = (
    Family("batched_matmul", BatchedSmallTemplate, optional=True),  # a small fused 2-layer chain, before attention
    Family("attention", AttentionTemplate),
    Family("interaction", InteractionTemplate),
    Family("segment", SegmentTemplate),
    Family("dual_gemm", DualGemmTemplate, optional=True),
    Family("cross", CrossTemplate, optional=True),
    Family("matmul_reduction", GemmReduceTemplate, optional=True),  # a GEMM and a reduction of its rows, before both
    Family("matmul", MatmulTemplate, optional=True),
    # before the pointwise ops that feed it (a masked sum's x * mask); a small scan inside a larger graph (the offsets
    # of a few lengths) may be cheaper left to ATen
    Family("scan", ScanTemplate, optional=True),
    Family("pool", PoolTemplate, optional=True),  # likewise with the ops that feed it; ATen's pools are fair ones
    Family("row_reduction", RowReduceTemplate),
    Family("pointwise", PointwiseTemplate),
)
NAMES: tuple[str, ...] = tuple(f.name for f in FAMILIES)
