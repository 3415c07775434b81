"""The Triton template library: one module per op family, each a kernel → launcher ladder with its search space."""
