"""A live model from Python: ``kernelevolve.optimize_model(model, inputs)``.

The model is saved (``torch.save``, so its class must be importable by its module, as for any pickled module) beside
a problem file that loads it: ``Model`` holds the saved model as ``model``, and ``get_inputs()`` draws fresh inputs
each call, from ``inputs``: a function that returns a fresh list (saved the same way), or a list of examples whose
floating-point tensors are drawn afresh (standard normal, their shapes and dtypes) and whose other entries (indices,
offsets, masks, numbers) are kept as given, so they stay valid. The run is then ``optimize-model`` on that file, and
``ModelOutcome.apply(model)`` puts its best_model.py onto the live model, sharing its parameters and buffers.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn

from kernelevolve.settings import DEFAULT_DB

PROBLEM = '''"""{name}: a live model given to kernelevolve.optimize_model, saved in {saved}."""
from pathlib import Path

import torch
import torch.nn as nn

_SAVED = Path({saved!r})


def _load(name):
    return torch.load(_SAVED / name, map_location="cpu", weights_only=False)


class Model(nn.Module):
    """The saved model, as ``model``."""

    def __init__(self):
        super().__init__()
        self.model = _load("model.pt")

    def forward(self, *args):
        return self.model(*args)


def get_inputs():
    """A fresh draw: from the saved function, or the examples with their floating-point tensors drawn afresh."""
    if (_SAVED / "inputs_fn.pt").exists():
        return list(_load("inputs_fn.pt")())
    return [torch.randn(x.shape, dtype=x.dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
            for x in _load("inputs.pt")]


def get_init_inputs():
    return []
'''


def write_problem(model: nn.Module, inputs: Sequence[Any] | Callable[[], Sequence[Any]], folder: Path,
                  name: str = "model") -> Path:
    """The problem file of a live model (and what it loads) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    saved = folder.resolve()
    try:
        torch.save(model, saved / "model.pt")
        if callable(inputs):
            torch.save(inputs, saved / "inputs_fn.pt")
        else:
            torch.save([x.detach().cpu() if isinstance(x, torch.Tensor) else x for x in inputs], saved / "inputs.pt")
    except Exception as e:  # a class defined in __main__ or a lambda: not loadable by the processes that judge it
        raise ValueError(f"the model and its inputs must be saved for the processes that judge them, and "
                         f"torch.save failed: {type(e).__name__}: {e}") from e
    path = saved / f"{name}.py"
    path.write_text(PROBLEM.format(name=name, saved=str(saved)))
    return path


def optimize_live(model: nn.Module, inputs: Sequence[Any] | Callable[[], Sequence[Any]], *,
                  out: str | Path = "kernelevolve-model", db: str | Path = DEFAULT_DB,
                  device: str | None = None, time_budget_s: float = 600.0, min_share: float | None = None,
                  hosts: Sequence[str] | None = None, on_stage: Callable[[str], None] = lambda s: None,
                  **options: Any) -> Any:
    """Optimize a live model on example inputs; ``options`` are OptimizeConfig fields (max_evals,
    timing_budget_ms, proposers, ...). Returns the ModelOutcome; its ``apply(model)`` gives the optimized module."""
    from kernelevolve.model.budget import MIN_SHARE
    from kernelevolve.model.run import optimize_model
    from kernelevolve.optimize import OptimizeConfig
    from kernelevolve.store import Store

    out = Path(out)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    path = write_problem(model, inputs, out / "input", type(model).__name__.lower() or "model")
    cfg = OptimizeConfig(device=device, **options)
    return optimize_model(path, cfg, Store(db), out, time_budget_s,
                          MIN_SHARE if min_share is None else min_share, on_stage=on_stage,
                          hosts=tuple(hosts) if hosts else None)
