"""Scans: ``cumsum`` and ``cumprod`` along any dimension, with the pointwise ops that feed them (a masked sum's
``x * mask``) and ``flip`` on either side of the scan (a reverse cumulative sum) read as the order of the scan.

A row (the scanned dimension, one position of every other) is scanned in chunks of BLOCK positions, each chunk's
scan added to (or multiplied by) the carry of the chunks before it. Rows along the last dimension are tiled
[ROWS, BLOCK], several short rows to a program; along an inner dimension the tile is [BLOCK, COLS], COLS neighbouring
rows read side by side so that the loads stay coalesced.
"""
from kernelevolve.templates.scan.template import SCANS, ScanTemplate

__all__ = ["SCANS", "ScanTemplate"]
