"""Feature interactions of recommendation models: the DLRM pairwise dot and the FM second-order term.

DLRM: ``bmm(T, T^T)`` (or the same ``einsum('bnd,bmd->bnm')``) where both operands are views of one [B, F, D] tensor,
then ``Z[:, li, lj]``, or on Z flattened to [B, F*F] ``[:, flat]``/``index_select(1, flat)``/``gather`` with one
position row for every batch row (``take_along_dim``), with index pairs that are graph constants (``tril_indices``, a
lifted list) or inputs (a module buffer), then optionally ``cat([dense, ..., pairs], 1)``. One program takes BLOCK_B
batch rows: it loads each row's [F, D] block once (from the pieces of the ``cat`` that built T, read in place), forms Z
with ``tl.dot``, gathers the pairs from registers and writes them straight into their columns of the output, next to
the copied dense columns.
FM: ``0.5 * (sum_f(x)^2 - sum_f(x^2))``, summed over D or not, with the scalar pointwise ops around it.
"""
from kernelevolve.templates.interaction.template import FAMILY, InteractionTemplate

__all__ = ["FAMILY", "InteractionTemplate"]
