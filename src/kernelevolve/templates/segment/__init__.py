"""Embedding bags and jagged segment reductions: gather rows (of a table, by index) and pool them per bag.

Recognised on the graph, whatever the spelling: ``_embedding_bag``/``embedding_bag`` (sum, mean, max; offsets with or
without the last one; per-sample weights; padding_idx); a gather (``embedding``, ``index_select``, ``index``) or a plain
values tensor pooled by ``index_put_(accumulate=True)``, ``index_add``, ``scatter_add`` or ``scatter_reduce`` with
segment ids (an input, built in the graph from lengths with ``repeat_interleave``, or from offsets with
``searchsorted(offsets, arange(N), right=True) - 1``, which makes them offsets again); ``segment_reduce`` with lengths
or offsets; ``sum``/``amax``/``amin`` over the bag axis of a [B, L, D] gather. One program pools one bag for one block
of D, accumulating in fp32; the pointwise ops that consume the pooled rows (a mean as sum / clamp(lengths)) run in the
same kernel, and so do bag counts the graph computes itself (``bincount`` of offset-built ids, ``diff(offsets)``).
Segment ids in any order are sorted in the launcher (argsort + searchsorted, no host sync). Offsets are taken to start
at 0, as ``embedding_bag`` requires. Bags by offsets of several tables of one width, with nothing fused after them,
are pooled in one launch (a third grid axis picks the table).
"""
from kernelevolve.templates.segment.template import FAMILY, SegmentTemplate

__all__ = ["FAMILY", "SegmentTemplate"]
