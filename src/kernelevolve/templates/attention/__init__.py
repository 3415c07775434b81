"""Attention: ``bmm(q, k^T)`` -> pointwise scores -> softmax over keys (or none) -> ``bmm(p, v)`` as one flash kernel.

The region is found from the second bmm upwards, so the manual spelling (matmul, masked_fill, softmax), the SDPA
decomposition (scaled q and k, an arange-built causal bias, the guard that zeroes fully masked rows) and pointwise
score attention (HSTU: ``silu(s) / n * mask``, no softmax) are one pattern. The score chain is generated with
``pointwise.expression``, so any elementwise score function works. Values that feed the scores without depending on
them (masks, biases) are computed from the query/key indices when built from ``arange``/``full``, and loaded with
broadcast strides otherwise. Where their values are known at capture (index-built, or module state such as a
``tril`` buffer) they are probed once: key blocks outside the band of ``j - i`` that can carry weight are skipped, and
inside it the mask terms that are constant there are folded away.
"""
from kernelevolve.templates.attention.template import AttentionTemplate

__all__ = ["AttentionTemplate"]
