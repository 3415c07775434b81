"""Pooling: ``avg_pool2d/3d`` and ``max_pool2d/3d`` (1-D pools reach the graph as 2-D ones over an unsqueezed dim),
with the pointwise ops that only feed them (an activation, a scale) computed as each window element is loaded.

One program computes BLOCK outputs of the flattened output. Each output walks its window, the whole window unrolled
when it is small and in a loop otherwise, with padding, dilation (max), ``ceil_mode`` windows that run past the
input, ``count_include_pad`` and ``divisor_override`` as PyTorch defines them; a max propagates NaN as PyTorch's
does.
"""
from kernelevolve.templates.pool.template import POOLS, PoolTemplate

__all__ = ["POOLS", "PoolTemplate"]
