"""Fused pointwise: any DAG of elementwise ops over one output shape becomes one kernel.

Shapes are fixed by the candidate's guard, so sizes and strides are written into the kernel as constants: index
arithmetic by constants compiles to multiplies and shifts. Dimensions that are contiguous for every operand are merged
first, so a plain [M, N] chain indexes linearly and a [N] bias on [M, N] costs one modulo.
"""
from kernelevolve.templates.pointwise.template import (PointwiseTemplate, broadcast_strides, contiguous_strides,
                                                       load_type, merge_dims, offset_expr)

__all__ = ["PointwiseTemplate", "broadcast_strides", "contiguous_strides", "load_type", "merge_dims", "offset_expr"]
