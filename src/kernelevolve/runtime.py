"""Use registered kernels: ``load`` returns the kernel class for a problem or a class, ``patch`` swaps the matching
submodules of a model for their kernels, checking each one's first call against the module it replaces."""
from __future__ import annotations

import enum
import functools
import logging
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

from kernelevolve.registry import Registry, RegistryError, class_signature, load_export, problem_signature

log = logging.getLogger(__name__)

# (rtol, atol) of the first-call check by output dtype; any other floating dtype gets 1e-3
TOLERANCES = {torch.float64: (1e-5, 1e-5), torch.float32: (1e-3, 1e-3), torch.float16: (2e-2, 2e-2),
              torch.bfloat16: (2e-2, 2e-2)}
KERNEL_CHILD = "_kernelevolve_kernel"  # where a patched root model keeps its kernel module
_PLAIN = (bool, int, float, str, type(None))
_UNSET = object()


class PatchWarning(UserWarning):
    """A kernel that patch() did not install, or that failed its first-call check and was dropped."""


class Check(enum.Enum):
    PENDING = "pending"  # the next call runs both modules and compares
    PASSED = "passed"  # only the kernel runs
    FAILED = "failed"  # only the original runs, for good


def load(problem_or_cls: Any, device: str | torch.device | None = None,
         registry: Registry | str | Path | None = None) -> type | None:
    """The ``ModelNew`` class of the best approved kernel for a problem (a file path or its source) or an
    ``nn.Module`` class, usable on ``device`` (default: the current CUDA device, else the CPU); None when there is
    none. Raises RegistryError for an unreadable problem or registry."""
    signature = _signature_of(problem_or_cls)
    reg = registry if isinstance(registry, Registry) else Registry(registry)
    entries = reg.usable(signature, device)
    for entry in entries:
        try:
            return load_export(entry["path"]).ModelNew
        except RegistryError as e:
            log.warning("skipping registered kernel: %s", e)
    log.info("no approved kernel for signature %s on %s in %s%s", signature[:16], device or "the current device",
             reg.root, " that imports" if entries else "")
    return None


def _signature_of(problem_or_cls: Any) -> str:
    if isinstance(problem_or_cls, type):
        return class_signature(problem_or_cls)
    if isinstance(problem_or_cls, Path) or (isinstance(problem_or_cls, str) and "\n" not in problem_or_cls
                                            and Path(problem_or_cls).is_file()):
        try:
            return problem_signature(Path(problem_or_cls).read_text())
        except (OSError, UnicodeDecodeError) as e:
            raise RegistryError(f"{problem_or_cls}: cannot read: {e}") from e
    if isinstance(problem_or_cls, str):
        try:
            return problem_signature(problem_or_cls)
        except RegistryError as e:
            raise RegistryError(f"neither a problem file nor problem source ({e}): {problem_or_cls[:80]!r}") from e
    raise RegistryError(f"expected a problem path, problem source or class, got {type(problem_or_cls).__name__}")


def patch(model: nn.Module, registry: Registry | str | Path | None = None, device: str | torch.device | None = None,
          verify: bool = True, rtol: float | None = None, atol: float | None = None,
          run: str | Path | None = None) -> list[str]:
    """Replace each submodule of ``model`` whose class matches an approved kernel usable on ``device`` (default: the
    submodule's own device) with that kernel, sharing the submodule's parameters and buffers. Returns the dotted
    names replaced ("" for the model itself, which is patched in place).

    With ``run`` (a ``kernelevolve optimize-model`` output folder, or its ``best_model.py``), the kernels are that
    run's instead: the model, or each submodule whose class is the run's ``Model``, runs ``best_model.py``'s
    ``ModelNew`` with its own parameters and buffers.

    With ``verify`` each replacement is a PatchedModule: its first call runs the kernel and the original and
    compares the outputs (per-dtype tolerances, or rtol/atol); on a mismatch or an exception it warns (PatchWarning)
    and keeps the original for good. The state_dict layout of the model is unchanged either way. Never raises for
    a bad registry or export: it warns and leaves that submodule alone."""
    if run is not None:
        return _patch_run(model, Path(run), verify, rtol, atol)
    try:
        reg = registry if isinstance(registry, Registry) else Registry(registry)
        signatures = {e["signature"] for e in reg.entries()}
    except (RegistryError, OSError, TypeError) as e:
        warnings.warn(f"kernelevolve.patch: registry unusable, model left unchanged: {e}", PatchWarning, stacklevel=2)
        return []
    done: dict[int, nn.Module | None] = {}  # id(submodule) -> its replacement: a shared submodule is built once
    sigs: dict[type, str | None] = {}
    exports: dict[str, ModuleType] = {}
    replaced: list[str] = []
    skip: list[str] = []
    for name, sub in list(model.named_modules(remove_duplicate=False)):
        if any(p == "" or name == p or name.startswith(p + ".") for p in skip):
            continue
        if _is_patched(sub):
            skip.append(name)
            continue
        if id(sub) not in done:
            if type(sub) not in sigs:
                sigs[type(sub)] = _try_signature(type(sub))
            if sigs[type(sub)] not in signatures:
                continue
            done[id(sub)] = _replacement(reg, sigs[type(sub)], name, sub, device, exports, verify, rtol, atol)
        new = done[id(sub)]
        if new is None:
            continue
        if name:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, new)
        else:
            _patch_root(model, new, verify, rtol, atol)
        replaced.append(name)
        skip.append(name)
    return replaced


def _patch_run(model: nn.Module, run: Path, verify: bool, rtol: float | None, atol: float | None) -> list[str]:
    """patch() from a whole-model run's best_model.py: every module whose class is the run's Model."""
    from kernelevolve.problem import import_module_from_path

    path = run / "best_model.py" if run.is_dir() else run
    try:
        module = import_module_from_path(path, f"_ke_model_run_{abs(hash(str(path.resolve())))}")
        target = class_signature(module.Model)
        init = list(module.get_init_inputs())
        module.ModelNew  # noqa: B018 - the contract's name, checked before any module is touched
    except Exception as e:  # a run's file is arbitrary code: whatever fails, the model stays as it is
        warnings.warn(f"kernelevolve.patch: {path} unusable, model left unchanged: {type(e).__name__}: {e}",
                      PatchWarning, stacklevel=3)
        return []
    replaced: list[str] = []
    for name, sub in list(model.named_modules()):
        if any(name == p or name.startswith(p + ".") or p == "" for p in replaced) or _is_patched(sub) \
                or _try_signature(type(sub)) != target:
            continue
        try:
            new = _shared(module, init, sub)
        except Exception as e:  # a model the run's constructor arguments do not fit: left alone
            warnings.warn(f"kernelevolve.patch: {name or 'the model'} left unchanged: {type(e).__name__}: {e}",
                          PatchWarning, stacklevel=3)
            continue
        new._kernelevolve = True
        if name:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, PatchedModule(sub, new, name, rtol, atol) if verify else new)
        else:
            _patch_root(model, new, verify, rtol, atol)
        replaced.append(name)
    return replaced


def _try_signature(cls: type) -> str | None:
    try:
        return class_signature(cls)
    except RegistryError as e:
        log.debug("not matched: %s", e)
        return None


def _is_patched(module: nn.Module) -> bool:
    return isinstance(module, PatchedModule) or getattr(module, "_kernelevolve", False) \
        or isinstance(module.__dict__.get("forward"), _RootForward)


def _replacement(reg: Registry, signature: str, name: str, sub: nn.Module, device: str | torch.device | None,
                 exports: dict[str, ModuleType], verify: bool, rtol: float | None, atol: float | None,
                 ) -> nn.Module | None:
    where = device if device is not None else _placement(sub)[0]
    label = f"{name or 'the model'} ({type(sub).__name__})"
    try:
        entries = reg.usable(signature, where)
    except RegistryError as e:  # the index changed under us
        warnings.warn(f"kernelevolve.patch: {label} left unchanged: {e}", PatchWarning, stacklevel=3)
        return None
    reasons = []
    for entry in entries:
        try:
            new = _build(entry["path"], sub, exports)
        except Exception as e:  # exported code is arbitrary: whatever fails, the submodule stays as it is
            reasons.append(f"{Path(entry['path']).name}: {type(e).__name__}: {e}")
            continue
        new._kernelevolve = True
        return PatchedModule(sub, new, name, rtol, atol) if verify and name else new
    if reasons:
        warnings.warn(f"kernelevolve.patch: {label} left unchanged: {'; '.join(reasons)}", PatchWarning, stacklevel=3)
    else:
        log.info("kernelevolve.patch: no approved kernel for %s usable on %s", label, where or "the current device")
    return None


def _build(path: str, sub: nn.Module, exports: dict[str, ModuleType]) -> nn.Module:
    """The export's ModelNew with the submodule's own parameter and buffer tensors (shared, not copied)."""
    if path not in exports:
        exports[path] = load_export(path)
    module = exports[path]
    return _shared(module, list(module.KERNELEVOLVE_EXPORT.get("init_inputs") or []), sub)


def _shared(module: ModuleType, init: list[Any], sub: nn.Module) -> nn.Module:
    """``module.ModelNew(*init)`` holding ``sub``'s own parameter and buffer tensors (shared, not copied)."""
    with torch.random.fork_rng(devices=[]):  # building must not move the caller's random stream
        _check_config(module.Model, init, sub)
        new = module.ModelNew(*init)
    dev, dtype = _placement(sub)
    if dev is not None or dtype is not None:
        new.to(device=dev, dtype=dtype)  # for tensors the state_dict does not hold
    state = sub.state_dict(keep_vars=True)
    grads = {k: v.requires_grad for k, v in state.items()}
    new.load_state_dict(state, strict=True, assign=True)  # raises on other keys or shapes
    for k, v in state.items():
        v.requires_grad_(grads[k])  # assign copies the fresh module's flags onto shared parameters: undo that
    return new.train(sub.training)


def _placement(module: nn.Module) -> tuple[torch.device | None, torch.dtype | None]:
    tensors = [*module.parameters(), *module.buffers()]
    floats = {t.dtype for t in module.parameters() if t.is_floating_point()}
    return (tensors[0].device if tensors else None), (floats.pop() if len(floats) == 1 else None)


def _check_config(model_cls: type, init: list, sub: nn.Module) -> None:
    """The plain attributes the export's Model gets from its init_inputs (dims, eps, flags) must be the submodule's:
    a state_dict does not show that a Softmax(dim=0) is not a Softmax(dim=1)."""
    try:
        with torch.device("meta"):
            ref = model_cls(*init)
    except Exception:  # a constructor that needs real tensors
        ref = model_cls(*init)
    have = _config(sub)
    bad = [f"{k}={have.get(k, '<unset>')!r} (kernel verified with {v!r})" for k, v in _config(ref).items()
           if have.get(k, _UNSET) != v]
    if bad:
        raise ValueError("built with other arguments: " + ", ".join(bad[:4]))


def _config(module: nn.Module) -> dict[str, Any]:
    return {f"{name}.{key}" if name else key: value for name, m in module.named_modules()
            for key, value in vars(m).items() if not key.startswith("_") and key != "training"
            and (isinstance(value, _PLAIN) or isinstance(value, tuple) and all(isinstance(x, _PLAIN) for x in value))}


class _Guard:
    """The check-once state of one replacement."""

    def __init__(self, label: str, verify: bool, rtol: float | None, atol: float | None):
        self.label, self.rtol, self.atol = label, rtol, atol
        self.check = Check.PENDING if verify else Check.PASSED

    def __call__(self, new: Any, original: Any, args: tuple, kwargs: dict) -> Any:
        if self.check is Check.PASSED:
            return new(*args, **kwargs)
        if self.check is Check.FAILED:
            return original(*args, **kwargs)
        try:
            with torch.no_grad():
                got = new(*_clone(args), **_clone(kwargs))
        except Exception as e:  # the kernel's failure must not become the model's
            self._fail(f"raised {type(e).__name__}: {e}")
            return original(*args, **kwargs)
        want = original(*args, **kwargs)
        try:
            problem = _mismatch(got, want, self.rtol, self.atol)
        except Exception as e:  # outputs too odd to compare are not a match
            problem = f"outputs not comparable: {type(e).__name__}: {e}"
        if problem:
            self._fail(f"disagrees with the original: {problem}")
        else:
            self.check = Check.PASSED
        return want

    def _fail(self, why: str) -> None:
        self.check = Check.FAILED
        warnings.warn(f"kernelevolve: the kernel for {self.label} {why}; using the original module from now on",
                      PatchWarning, stacklevel=4)


class PatchedModule(nn.Module):
    """A registered kernel standing in for a submodule (``original``). The first call runs both and compares; after
    that only one runs. Its state_dict has the original submodule's keys (those of the module in use)."""

    def __init__(self, original: nn.Module, new: nn.Module, name: str = "", rtol: float | None = None,
                 atol: float | None = None):
        super().__init__()
        self.original = original
        self.new = new
        self.guard = _Guard(f"{name} ({type(original).__name__})", True, rtol, atol)
        self.register_state_dict_post_hook(_expose_active)
        self.register_load_state_dict_pre_hook(_feed_both)

    @property
    def active(self) -> nn.Module:
        return self.new if self.guard.check is Check.PASSED else self.original

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.guard(self.new, self.original, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            modules = self.__dict__.get("_modules", {})
            if "original" not in modules:
                raise
            return getattr(modules["original"], name)  # model.block.fc still reaches the original's fc

    def extra_repr(self) -> str:
        return f"check={self.guard.check.value}"


def _expose_active(module: PatchedModule, state: dict, prefix: str, metadata: Any) -> None:
    keep, other = ("new", "original") if module.guard.check is Check.PASSED else ("original", "new")
    _rename(state, drop=f"{prefix}{other}.", strip=f"{prefix}{keep}.", to=prefix)


def _feed_both(module: PatchedModule, state: dict, prefix: str, *_: Any) -> None:
    for key in [k for k in state if k.startswith(prefix)]:
        rest = key[len(prefix):]
        if not rest.startswith(("original.", "new.")):
            value = state.pop(key)
            state[f"{prefix}original.{rest}"] = state[f"{prefix}new.{rest}"] = value


class _RootForward:
    """The forward of a model that itself matched: it cannot be swapped in its caller, so its instance forward is."""

    def __init__(self, model: nn.Module, guard: _Guard):
        self.model, self.guard = model, guard

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        original = functools.partial(type(self.model).forward, self.model)
        return self.guard(self.model._modules[KERNEL_CHILD], original, args, kwargs)


def _patch_root(model: nn.Module, new: nn.Module, verify: bool, rtol: float | None, atol: float | None) -> None:
    model.add_module(KERNEL_CHILD, new)  # a child, so that .to() and .train() reach it
    model.forward = _RootForward(model, _Guard(f"the model ({type(model).__name__})", verify, rtol, atol))
    model.register_state_dict_post_hook(_hide_kernel)
    model.register_load_state_dict_pre_hook(_feed_kernel)


def _hide_kernel(module: nn.Module, state: dict, prefix: str, metadata: Any) -> None:
    _rename(state, drop=f"{prefix}{KERNEL_CHILD}.")


def _feed_kernel(module: nn.Module, state: dict, prefix: str, *_: Any) -> None:
    for rest in module._modules[KERNEL_CHILD].state_dict():
        if prefix + rest in state:
            state[f"{prefix}{KERNEL_CHILD}.{rest}"] = state[prefix + rest]


def _rename(state: dict, drop: str, strip: str | None = None, to: str = "") -> None:
    """Drop the keys under ``drop`` and move those under ``strip`` to ``to``, in the tensors and in the version
    metadata (whose keys are module prefixes without the final dot)."""
    for table, dot in ((state, ""), (getattr(state, "_metadata", None) or {}, ".")):
        for key in list(table):
            k = key + dot
            if k.startswith(drop):
                del table[key]
            elif strip and k.startswith(strip):
                moved = to + k[len(strip):]
                table[moved[:-1] if dot else moved] = table.pop(key)


def _mismatch(got: Any, want: Any, rtol: float | None, atol: float | None) -> str:
    """Why ``got`` is not ``want`` within tolerance; "" when it is."""
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"got {type(got).__name__}, expected a tensor"
        if (got.shape, got.dtype, got.device) != (want.shape, want.dtype, want.device):
            return f"got {tuple(got.shape)} {got.dtype} on {got.device}, expected {tuple(want.shape)} {want.dtype} " \
                   f"on {want.device}"
        got, want = got.detach(), want.detach()
        if not (want.is_floating_point() or want.is_complex()):
            return "" if torch.equal(got, want) else "integer outputs differ"
        r, a = TOLERANCES.get(want.dtype, (1e-3, 1e-3))
        r, a = r if rtol is None else rtol, a if atol is None else atol
        if torch.allclose(got, want, rtol=r, atol=a, equal_nan=True):
            return ""
        wide = torch.promote_types(want.dtype, torch.float32)
        diff = (got.to(wide) - want.to(wide)).abs().nan_to_num(nan=float("inf")).max().item()
        return f"max abs diff {diff:.3g} (rtol={r:g}, atol={a:g})"
    if isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            return "the output structure differs"
        return next((f"output {i}: {m}" for i, (g, w) in enumerate(zip(got, want))
                     if (m := _mismatch(g, w, rtol, atol))), "")
    if isinstance(want, dict):
        if not isinstance(got, dict) or got.keys() != want.keys():
            return "the output keys differ"
        return next((f"output {k!r}: {m}" for k in want if (m := _mismatch(got[k], want[k], rtol, atol))), "")
    return "" if bool(got == want) else f"got {got!r}, expected {want!r}"


def _clone(value: Any) -> Any:
    """Fresh copies of the tensors in the arguments: the kernel runs first and must not touch the originals."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple):
        items = [_clone(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, list):
        return [_clone(v) for v in value]
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value
