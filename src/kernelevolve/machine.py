"""The machine a run is on: its device, the device model that timings compare across, the library versions."""
from __future__ import annotations

import platform
from typing import Any

import torch

import kernelevolve


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def here(device: str, executor: str) -> str:
    """Where this process can run the reference: the run's device, or the CPU for a controller without a GPU that
    sends its evaluations to a cluster (the workers run them on the run's device)."""
    if device == "cuda" and executor != "local" and not torch.cuda.is_available():
        return "cpu"
    return device


def device_key(device: str) -> str:
    """What a timing is comparable across: the device model (and index-free)."""
    if device == "cuda":
        return f"cuda:{torch.cuda.get_device_name(0)}"
    return f"cpu:{platform.machine()}:{platform.processor() or 'cpu'}"


def versions() -> dict[str, Any]:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"kernelevolve": kernelevolve.__version__, "torch": torch.__version__, "triton": triton_version,
            "python": platform.python_version()}
