"""Graph analysis: capture the reference at the ATen level, then partition it into regions templates can fuse."""
from kernelevolve.analyze.graph import CapturedGraph, CaptureError, capture

__all__ = ["CaptureError", "CapturedGraph", "capture"]
