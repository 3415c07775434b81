"""kernelevolve: autonomous kernel optimization for PyTorch operators."""
__version__ = "0.1.0"
