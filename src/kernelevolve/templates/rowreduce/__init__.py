"""Fused reductions along one dimension, with every pointwise op around them: softmax, log-softmax, layer norm,
RMS norm with its residual, cross-entropy, sums, means, maxima, column reductions.

A region is a set of nodes over one shape F reduced along one dim d. Each value in it is a *vector* (varies along d,
held as a [BLOCK_R, BLOCK_C] tile) or a *row scalar* (held as [BLOCK_R, 1]). A row scalar may live in the squeezed
frame (a reduction with keepdim=False); views that only add or drop the reduced dim are free. ``gather`` along d by a
row-scalar index becomes a masked sum, which fuses cross-entropy's target pick.

Two schedules: *persistent* keeps the whole row in registers (one read of every input); *looped* walks the row in
chunks, one pass per reduction plus one for the vector outputs, recomputing pointwise work instead of storing it.
"""
from kernelevolve.templates.rowreduce.template import RowReduceTemplate, splittable

__all__ = ["RowReduceTemplate", "splittable"]
