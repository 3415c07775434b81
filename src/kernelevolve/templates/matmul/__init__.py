"""Matmul-shaped families: a tiled GEMM with a fused pointwise epilogue, and the larger patterns built on it.

``mm``/``addmm``/``bmm``/``baddbmm`` are matched on the graph: the views and casts that feed an operand are replayed
in the launcher as strides (a weight's ``permute`` costs no copy), and the pointwise nodes that consume the product
(bias, activation, scale, residual, casts, order-keeping views) run in the kernel before the one store. Extra epilogue
operands are broadcast to the output in the launcher and read through their strides (a cast of one, such as a half
bias up-cast to fp32, is done on the loaded values); a stride that is zero for every shape (a bias along M) is left out
of the address. Half operands up-cast for an fp32 GEMM (how half ``baddbmm`` traces) are multiplied as half tiles.
Families tried first claim bigger regions: two GEMMs that share their A and meet in one pointwise result (SwiGLU), two
chained batched layers (multi-task towers), DCN cross layers, and a GEMM whose rows are reduced in the same kernel
(softmax, logsumexp over a narrow product).
"""
from kernelevolve.templates.matmul.template import BatchedSmallTemplate, CrossTemplate, DualGemmTemplate, MatmulTemplate
from kernelevolve.templates.matmul.launch import KNOBS, fit, gemm_space, has_tma
from kernelevolve.templates.matmul.reduce import GemmReduceTemplate

__all__ = ["KNOBS", "BatchedSmallTemplate", "CrossTemplate", "DualGemmTemplate", "GemmReduceTemplate",
           "MatmulTemplate", "fit", "gemm_space", "has_tma"]
