"""Load and validate a KernelBench-format problem file.

A problem file defines ``class Model(nn.Module)``, ``get_inputs()`` (CPU tensors) and ``get_init_inputs()``
(constructor arguments). Optional module-level extensions:

- ``ATOL`` / ``RTOL``: tolerances that replace the per-dtype defaults;
- ``ALLOW_TF32 = True``: float32 matmuls may use TF32 (the fp32 tolerance is loosened to match);
- ``get_extra_inputs()``: a list of further input lists (other shapes) that every candidate is verified on.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import random
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakTensorKeyDictionary


# Seeding and drawing use the process-wide generators: evaluation threads drawing for different seeds at once would
# draw from each other's seeds. One draw (or model build) at a time.
_RNG_LOCK = threading.RLock()


class ProblemError(Exception):
    """A problem file that cannot be used: names the file and the cause in one line."""

    def __init__(self, path: str | Path, cause: str):
        super().__init__(f"{path}: {cause}")
        self.path, self.cause = str(path), cause


@dataclass(frozen=True)
class Problem:
    path: str
    source: str
    sha: str
    name: str
    atol: float | None = None
    rtol: float | None = None
    allow_tf32: bool = False
    n_shapes: int = 1
    mutates_inputs: bool = False
    output_dtypes: tuple[str, ...] = ()
    # per output, the least precise floating dtype an op of the reference rounded a value to on the way to it ("" where
    # none is less precise than the output's own): a float32 output of a bfloat16 sum is judged at bfloat16's tolerance
    rounded_in: tuple[str, ...] = ()
    # buffers and parameters the forward writes (running statistics in training mode), by name: judged after a call
    # from the initial state, beside the outputs
    mutated_state: tuple[str, ...] = ()

    @property
    def short_sha(self) -> str:
        return self.sha[:12]


def source_sha(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def import_module_from_path(path: str | Path, name: str) -> ModuleType:
    """Execute a Python file as a fresh module called ``name`` (registered in sys.modules)."""
    spec = importlib.util.spec_from_file_location(name, str(path))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed % 2**32)


def n_shapes(module: ModuleType) -> int:
    extra = getattr(module, "get_extra_inputs", None)
    return 1 + (len(extra()) if callable(extra) else 0)


def make_inputs(module: ModuleType, seed: int, shape_index: int = 0, device: str | None = None) -> list[Any]:
    """The problem's inputs for one seed: shape 0 is ``get_inputs()``, shape k>0 is ``get_extra_inputs()[k-1]``.

    With a CUDA ``device`` the inputs are drawn under that default device: random tensors are then made on the GPU,
    far faster than on the CPU for large inputs, and every process on the same GPU model draws the same values.
    A ``get_inputs()`` that cannot run that way is drawn on the CPU and moved."""
    if device is not None and torch.device(device).type == "cuda":
        try:
            # under the lock too: torch.device() also sets a process-wide current device while it is entered
            with _RNG_LOCK, torch.device(device):
                return to_device(_draw(module, seed, shape_index), device)
        except torch.OutOfMemoryError:
            raise  # no room for the inputs: a draw on the CPU would not fit when moved either (and takes seconds)
        except Exception:  # the user's get_inputs(): it may need CPU tensors
            pass
    inputs = _draw(module, seed, shape_index)
    return to_device(inputs, device) if device is not None else inputs


def input_specs(module: ModuleType, seed: int, shape_index: int = 0, device: str | None = None,
                meta_only: bool = False) -> list[tuple[tuple[int, ...], torch.dtype] | None] | None:
    """(shape, dtype) of each input drawn with ``seed`` (None for a non-tensor), without making the data where the
    shapes do not depend on it: drawn on the meta device first, which costs nothing at any size; a ``get_inputs()``
    whose sizes come from its random values (jagged totals) cannot run there and is drawn for real (or, with
    ``meta_only``, not at all: None)."""
    values = meta_inputs(module, seed, shape_index)
    if values is None:
        if meta_only:
            return None
        values = make_inputs(module, seed, shape_index, device)
    return [(tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else None for v in values]


def meta_inputs(module: ModuleType, seed: int, shape_index: int = 0) -> list[Any] | None:
    """The inputs drawn with ``seed`` on the meta device (shapes and dtypes, no data; non-tensor inputs as they are),
    or None where ``get_inputs()`` needs real values to run (sizes from random values) or leaves the meta device."""
    try:
        with _RNG_LOCK, torch.device("meta"):
            values = _draw(module, seed, shape_index)
    except Exception:  # the user's get_inputs(): it may need real values
        return None
    return values if all(v.device.type == "meta" for v in values if isinstance(v, torch.Tensor)) else None


def _draw(module: ModuleType, seed: int, shape_index: int) -> list[Any]:
    with _RNG_LOCK:
        seed_everything(seed)
        if shape_index == 0:
            return list(module.get_inputs())
        return list(module.get_extra_inputs()[shape_index - 1])


def build_model(module: ModuleType, cls_name: str, init_seed: int) -> torch.nn.Module:
    with _RNG_LOCK:
        seed_everything(init_seed)
        return getattr(module, cls_name)(*module.get_init_inputs())


def as_outputs(out: Any) -> tuple[Any, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def to_device(values: Sequence[Any], device: str | torch.device) -> list[Any]:
    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


def _check_attr(path: Path, module: ModuleType, name: str, kind: str) -> None:
    obj = getattr(module, name, None)
    if obj is None:
        raise ProblemError(path, f"defines no {kind} `{name}`")
    if not callable(obj):
        raise ProblemError(path, f"`{name}` is not callable")


def _call(path: Path, what: str, fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # the user's code: any failure is a bad problem file
        raise ProblemError(path, f"{what} raised {type(e).__name__}: {_first_line(e)}") from e


def same_values(a: torch.Tensor, b: torch.Tensor, chunk: int = 1 << 24) -> bool:
    """Bitwise-equal values, with NaN equal to NaN (torch.equal alone calls an untouched input holding a NaN
    "mutated"). A chunk at a time: the copies it makes stay small next to inputs of many GB. ``b`` may be on
    another device than ``a`` (a copy kept in host memory): its chunks go to ``a``'s."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    floating = a.is_floating_point() or a.is_complex()
    if not floating and a.device == b.device:
        return torch.equal(a, b)
    a, b = a.reshape(-1), b.reshape(-1)
    for i in range(0, a.numel(), chunk):
        x, y = a[i:i + chunk], b[i:i + chunk].to(a.device)
        if not floating:
            if not torch.equal(x, y):
                return False
        elif not (torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(), y.nan_to_num())):
            return False
    return True


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else ""


def read_source(path: str | Path) -> str:
    """The source of a problem file; ProblemError when it is missing, unreadable or not Python."""
    path = Path(path)
    if not path.is_file():
        raise ProblemError(path, "no such file")
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ProblemError(path, f"cannot read: {e}") from e
    try:
        compile(source, str(path), "exec")
    except SyntaxError as e:
        raise ProblemError(path, f"syntax error at line {e.lineno}: {e.msg}") from e
    return source


def load_problem(path: str | Path, device: str = "cpu") -> Problem:
    """Import the problem file, run its reference once on ``device`` and return a validated Problem."""
    path = Path(path)
    source = read_source(path)
    sha = source_sha(source)
    try:
        module = import_module_from_path(path, f"_ke_problem_{sha[:12]}")
    except Exception as e:
        raise ProblemError(path, f"import failed: {type(e).__name__}: {_first_line(e)}") from e
    _check_attr(path, module, "Model", "class")
    _check_attr(path, module, "get_inputs", "function")
    _check_attr(path, module, "get_init_inputs", "function")
    if not isinstance(module.Model, type) or not issubclass(module.Model, torch.nn.Module):
        raise ProblemError(path, "`Model` is not a subclass of torch.nn.Module")
    init = _call(path, "get_init_inputs()", module.get_init_inputs)
    if not isinstance(init, (list, tuple)):
        raise ProblemError(path, f"get_init_inputs() returned {type(init).__name__}, expected a list")
    shapes = _call(path, "get_extra_inputs()", n_shapes, module)
    model = _call(path, "Model(*get_init_inputs())", build_model, module, "Model", 0).to(device)
    dtypes: tuple[str, ...] = ()
    rounded: tuple[str, ...] = ()
    mutates = False
    state = _state_marks(model)
    written: set[str] = set()
    for k in range(shapes):
        # drawn on the device itself where it can be: a CPU draw of gigabytes of inputs takes seconds
        inputs = _call(path, "get_inputs()" if k == 0 else f"get_extra_inputs()[{k - 1}]", make_inputs, module, 0, k,
                       device)
        before = [v.clone() if isinstance(v, torch.Tensor) else v for v in inputs]
        tracker = _Rounding() if k == 0 else None
        try:
            with torch.no_grad(), tracker or contextlib.nullcontext():
                out = model(*inputs)
        except Exception:  # the forward's own error, or one a dispatch mode causes (a compiled region): once more, plain
            tracker = None
            with torch.no_grad():
                out = _call(path, "Model.forward", model, *inputs)
        outs = as_outputs(out)
        if tracker is not None:
            rounded = tuple(tracker.of(o) for o in outs)
        bad = [type(o).__name__ for o in outs if not isinstance(o, torch.Tensor)]
        if bad or not outs:
            raise ProblemError(path, f"forward returned a non-tensor output ({', '.join(bad) or 'empty'})")
        if k == 0:
            dtypes = tuple(str(o.dtype).removeprefix("torch.") for o in outs)
        mutates = mutates or any(
            isinstance(b, torch.Tensor) and not same_values(b, v) for b, v in zip(before, inputs)
        )
        now = _state_marks(model)
        written |= {n for n, mark in state.items() if _written(mark, now.get(n))}
    return Problem(
        path=str(path.resolve()),
        source=source,
        sha=sha,
        name=path.stem,
        atol=_float_attr(path, module, "ATOL"),
        rtol=_float_attr(path, module, "RTOL"),
        allow_tf32=bool(getattr(module, "ALLOW_TF32", False)),
        n_shapes=shapes,
        mutates_inputs=mutates,
        output_dtypes=dtypes,
        rounded_in=rounded,
        mutated_state=tuple(n for n in state if n in written),
    )


def _state_marks(model: torch.nn.Module) -> dict[str, tuple[torch.Tensor, int, torch.Tensor | None]]:
    """Each buffer and parameter with its version counter, and a copy of each buffer: a forward that rebinds one
    leaves another tensor there, a write through torch bumps the counter, and a buffer a native kernel writes (batch
    norm's running statistics) changes value. Parameters, the bulk of a model, are not copied."""
    marks: dict[str, tuple[torch.Tensor, int, torch.Tensor | None]] = {}
    with torch.no_grad():
        for n, t in model.named_buffers():
            marks[n] = (t, t._version, t.clone())
        for n, t in model.named_parameters():
            marks[n] = (t, t._version, None)
    return marks


def _written(before: tuple[torch.Tensor, int, torch.Tensor | None],
             now: tuple[torch.Tensor, int, torch.Tensor | None] | None) -> bool:
    if now is None:
        return False
    return now[0] is not before[0] or now[1] != before[1] or (before[2] is not None
                                                             and not same_values(before[2], now[0]))


class StateSlots:
    """The buffers and parameters ``names`` of ``model``, each read from its owning module's own table every time (a
    forward may rebind one; nn.Module's __getattr__, which a model may override, is not asked), and put back to the
    values they had when the slots were made."""

    def __init__(self, model: torch.nn.Module, names: Sequence[str]):
        self.slots: list[tuple[dict[str, Any], str]] = []
        for name in names:
            prefix, _, leaf = name.rpartition(".")
            try:
                owner = torch.nn.Module.get_submodule(model, prefix) if prefix else model
            except AttributeError:
                raise KeyError(name) from None
            table = next((t for t in (owner._buffers, owner._parameters)
                          if type(t.get(leaf)) in (torch.Tensor, torch.nn.Parameter)), None)
            if table is None:
                raise KeyError(name)
            self.slots.append((table, leaf))
        with torch.no_grad():
            self.initial = [t.detach().clone() for t in self.read()]

    def read(self) -> list[torch.Tensor]:
        return [table[leaf] for table, leaf in self.slots]

    def values(self) -> tuple[torch.Tensor, ...]:
        """Copies of what the slots hold now: the state a call left, to be judged."""
        return tuple(t.detach().clone() for t in self.read())

    def reset(self) -> None:
        """The initial values back: copied in place, a few launches (one per device and dtype); a slot that now holds
        a tensor of another shape, dtype or device (a rebinding forward) gets a copy of its initial tensor."""
        groups: dict[tuple[Any, ...], tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        with torch.no_grad():
            for (table, leaf), init in zip(self.slots, self.initial):
                t = table[leaf]
                if not isinstance(t, torch.Tensor) or (t.shape, t.dtype, t.device) != (init.shape, init.dtype,
                                                                                         init.device):
                    fresh = init.clone()
                    table[leaf] = torch.nn.Parameter(fresh, t.requires_grad) if isinstance(t, torch.nn.Parameter) \
                        else fresh
                    continue
                dst, src = groups.setdefault((t.device, t.dtype), ([], []))
                dst.append(t)
                src.append(init)
            for dst, src in groups.values():
                torch._foreach_copy_(dst, src)


def _float_attr(path: Path, module: ModuleType, name: str) -> float | None:
    value = getattr(module, name, None)
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError) as e:
        raise ProblemError(path, f"{name} must be a number, got {value!r}") from e


# Ops that move or pick values without rounding them: their results are as precise as their inputs, whatever dtype
# they carry (a gather of a bfloat16 table then cast to float32 has lost nothing).
_MOVES = {"view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "t", "slice", "select", "index",
          "index_select", "embedding", "gather", "cat", "stack", "clone", "contiguous", "squeeze", "unsqueeze", "alias",
          "detach", "lift_fresh", "lift_fresh_copy", "copy", "copy_", "flatten", "unflatten", "split", "chunk",
          "narrow", "unbind", "as_strided", "repeat", "tile", "flip", "roll", "constant_pad_nd", "zeros", "zeros_like",
          "ones", "ones_like", "full", "full_like", "empty", "empty_like", "new_zeros", "new_ones", "new_full",
          "new_empty", "arange", "scalar_tensor", "where", "masked_fill", "_to_copy", "to"}
_PRECISION = {torch.float64: 3, torch.float32: 2, torch.float16: 1, torch.bfloat16: 0}


class _Rounding(TorchDispatchMode):
    """Follows, through one call of the reference, the least precise floating dtype an op rounded a value to on the
    way to each tensor: an arithmetic op whose result is float16 or bfloat16 rounds to it (so does a cast down);
    moves, views and gathers pass their inputs' on. Read once per problem, when it loads."""

    def __init__(self) -> None:
        super().__init__()
        self.least: WeakTensorKeyDictionary = WeakTensorKeyDictionary()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            self._note(func, args, kwargs, out)
        except Exception:  # only informs the tolerance: an op it cannot follow leaves its result untagged
            pass
        return out

    def _note(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        seen = [self.least.get(t) for t in _tensors((args, kwargs)) if t in self.least]
        name = func.overloadpacket.__name__.rstrip("_") if hasattr(func, "overloadpacket") else ""
        for t in _tensors(out):
            if not t.is_floating_point():
                continue
            here = list(seen)
            if name not in _MOVES or (name in ("_to_copy", "to", "copy")
                                      and _PRECISION.get(t.dtype, 2) < min(map(_precision_of, _tensors(args)),
                                                                         default=3)):
                here.append(t.dtype)
            least = min(here, key=lambda d: _PRECISION.get(d, 2), default=None)
            if least is not None:
                self.least[t] = least

    def of(self, out: Any) -> str:
        """The dtype ``out`` was rounded in where it is less precise than ``out``'s own, else ""."""
        least = self.least.get(out) if isinstance(out, torch.Tensor) else None
        if least is None or not out.is_floating_point() or _PRECISION.get(least, 2) >= _PRECISION.get(out.dtype, 2):
            return ""
        return str(least).removeprefix("torch.")


def _precision_of(t: torch.Tensor) -> int:
    return _PRECISION.get(t.dtype, 2) if t.is_floating_point() else 3


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in torch.utils._pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]
