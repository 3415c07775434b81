"""Executors: where evaluations run."""
from kernelevolve.engine.local import LocalPool

__all__ = ["LocalPool"]
