"""kernelevolve: autonomous kernel optimization for PyTorch operators."""
__version__ = "0.1.0"

# load and patch import torch: resolve them on first use so that `import kernelevolve` stays light
_LAZY = {"load": "kernelevolve.runtime", "patch": "kernelevolve.runtime", "Registry": "kernelevolve.registry",
         "optimize_model": "kernelevolve.model.live"}
_NAMES = {"optimize_model": "optimize_live"}  # the public name where the module's differs


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), _NAMES.get(name, name))
    raise AttributeError(f"module 'kernelevolve' has no attribute {name!r}")
