"""A registry of approved exported kernels, keyed by the signature of the reference class they replace.

Layout: ``root/<signature[:16]>/<device>-<capability or 'any'>/<candidate_sha[:12]>.py`` (plus the export's
``test_<stem>.py`` when it has one) and ``root/index.json``, a list of entries. The signature hashes a class's body, not
its name, so a user's ``class GeluMLP`` matches the ``class Model`` of the problem it was written from.
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import inspect
import itertools
import json
import logging
import os
import shutil
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import torch

from kernelevolve.problem import import_module_from_path

try:
    import fcntl
except ImportError:  # Windows: writers to one registry are not serialized
    fcntl = None

log = logging.getLogger(__name__)

ENV_VAR = "KERNELEVOLVE_REGISTRY"
DEFAULT_REGISTRY = Path(os.environ.get(ENV_VAR) or "~/.kernelevolve/registry").expanduser()
INDEX = "index.json"
ENTRY_KEYS = ("path", "signature", "name", "problem_name", "device", "device_name", "capability", "speedup",
              "candidate_sha", "approved", "created")
# `class Model(nn.Module)` and `class GeluMLP(torch.nn.Module)` name the same base
_MODULE_BASES = {"Module", "nn.Module", "torch.nn.Module", "torch.nn.modules.module.Module"}
_names = itertools.count()


class RegistryError(Exception):
    pass


def class_signature(cls: type) -> str:
    """sha256 of the class body, independent of its name, comments, docstrings and formatting."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError) as e:
        node = _class_from_methods(cls)  # a module loaded from a path but not entered in sys.modules
        if node is None:
            raise RegistryError(f"no source for class {cls.__qualname__} (defined interactively or in compiled "
                                f"code?): {e}") from e
        return _signature(node)
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise RegistryError(f"cannot parse the source of class {cls.__qualname__}: {e}") from e
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)
    if node is None:
        raise RegistryError(f"no class statement in the source of {cls.__qualname__}")
    return _signature(node)


def _class_from_methods(cls: type) -> ast.ClassDef | None:
    """The class statement of ``cls`` found through the file and line of one of its own methods, or None."""
    for value in vars(cls).values():
        code = getattr(value, "__code__", None)
        if code is None:
            continue
        try:
            tree = ast.parse(Path(code.co_filename).read_text())
        except (OSError, SyntaxError, ValueError):
            return None
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == cls.__name__ \
                    and node.lineno <= code.co_firstlineno <= (node.end_lineno or node.lineno):
                return node
        return None
    return None


def problem_signature(problem_source: str) -> str:
    """The class_signature of the ``Model`` class defined in a problem file's source (parsed, not imported)."""
    try:
        tree = ast.parse(problem_source)
    except SyntaxError as e:
        raise RegistryError(f"problem source does not parse: line {e.lineno}: {e.msg}") from e
    models = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"]
    if not models:
        raise RegistryError("problem source defines no class Model")
    return _signature(models[-1])  # the last definition is the one that counts at import


def _signature(node: ast.ClassDef) -> str:
    node = _Normalize(node.name).visit(ast.parse(ast.unparse(node)).body[0])  # work on a copy
    return hashlib.sha256(ast.unparse(node).encode()).hexdigest()


class _Normalize(ast.NodeTransformer):
    """Renames the class (and references to it, as in ``super(Model, self)``) to ``_``, drops docstrings and
    spells a torch.nn.Module base one way."""

    def __init__(self, name: str):
        self.name = name

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        if node.name == self.name:
            node.name = "_"
        node.bases = [ast.Name("nn.Module") if ast.unparse(b) in _MODULE_BASES else b for b in node.bases]
        return self._strip_docstring(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        return self._strip_docstring(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id == self.name:
            node.id = "_"
        return node

    def _strip_docstring(self, node: Any) -> ast.AST:
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
        self.generic_visit(node)
        return node


def load_export(path: str | Path) -> ModuleType:
    """Import an exported module file under a fresh module name and check the names of its contract."""
    path = Path(path)
    if not path.is_file():
        raise RegistryError(f"{path}: no such export file")
    digest = hashlib.sha256(f"{path.resolve()}\n".encode() + path.read_bytes()).hexdigest()[:12]
    try:
        module = import_module_from_path(path, f"_ke_export_{digest}_{next(_names)}")
    except Exception as e:  # an export is arbitrary code: any failure to import makes it unusable
        raise RegistryError(f"{path}: import failed: {type(e).__name__}: {e}") from e
    for name in ("KERNELEVOLVE_EXPORT", "Model", "ModelNew"):
        if not hasattr(module, name):
            raise RegistryError(f"{path}: not an exported kernel module (no {name})")
    if not isinstance(module.KERNELEVOLVE_EXPORT, dict):
        raise RegistryError(f"{path}: KERNELEVOLVE_EXPORT is not a dict")
    return module


def device_key(device: str | torch.device | None = None) -> tuple[str, list[int] | None]:
    """(device type, [major, minor] for CUDA else None); None means the current CUDA device, else the CPU."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
        return (dev.type, None) if dev.type != "cuda" else ("cuda", list(torch.cuda.get_device_capability(dev)))
    except (AssertionError, RuntimeError) as e:  # no such device, torch built without CUDA, or no driver
        raise RegistryError(f"cannot use device {device!r}: {e}") from e


def _read_export(path: Path) -> tuple[dict[str, Any], str]:
    """(KERNELEVOLVE_EXPORT, signature of its Model). Read from the source when the dict is a literal, so that an
    export for another device can be registered without importing it; imported otherwise."""
    try:
        source = path.read_text()
        tree = ast.parse(source)
    except (OSError, UnicodeDecodeError, SyntaxError) as e:
        raise RegistryError(f"{path}: cannot read: {e}") from e
    meta, defined = None, set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        defined.update(t.id for t in targets if isinstance(t, ast.Name))
        if isinstance(node, ast.ClassDef):
            defined.add(node.name)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update(a.asname or a.name.split(".")[0] for a in node.names)
        if any(isinstance(t, ast.Name) and t.id == "KERNELEVOLVE_EXPORT" for t in targets) and node.value:
            with contextlib.suppress(ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                meta = ast.literal_eval(node.value)
    static = isinstance(meta, dict) and {"Model", "ModelNew"} <= defined
    if static:
        with contextlib.suppress(RegistryError):  # Model may be bound from elsewhere rather than defined here
            return meta, problem_signature(source)
    try:
        module = load_export(path)
    except RegistryError as e:
        if not (static and isinstance(meta.get("signature"), str) and meta["signature"]):
            raise
        log.warning("%s: %s; registering it under its declared signature", path, e)
        return meta, meta["signature"]
    return module.KERNELEVOLVE_EXPORT, class_signature(module.Model)


class Registry:
    """Approved exports on disk, with an index to pick the best one for a class signature and a device."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root if root is not None else os.environ.get(ENV_VAR) or DEFAULT_REGISTRY).expanduser()

    @property
    def index_path(self) -> Path:
        return self.root / INDEX

    def add(self, export_path: str | Path) -> Path:
        """Copy an approved export (and its sibling ``test_<stem>.py``) into the registry; returns the new path."""
        src = Path(export_path)
        meta, signature = _read_export(src)
        if not meta.get("approved"):
            raise RegistryError(f"{src}: not approved (KERNELEVOLVE_EXPORT has no 'approved'); approve it first")
        for key in ("device", "candidate_sha"):
            if not isinstance(meta.get(key), str) or not meta[key]:
                raise RegistryError(f"{src}: KERNELEVOLVE_EXPORT has no {key!r}")
        if meta.get("signature") and meta["signature"] != signature:
            log.warning("%s: declared signature %s differs from its Model's %s; indexing under the latter",
                        src, str(meta["signature"])[:16], signature[:16])
        cap = meta.get("capability")
        folder = f"{meta['device']}-{'.'.join(map(str, cap)) if cap else 'any'}"
        dest = self.root / signature[:16] / folder / f"{meta['candidate_sha'][:12]}.py"
        entry = {"path": dest.relative_to(self.root).as_posix(), "signature": signature}
        entry.update({k: meta.get(k) for k in ENTRY_KEYS if k not in entry})
        entry["capability"] = list(cap) if cap else None
        with self._locked():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
            test = src.with_name(f"test_{src.stem}.py")
            if test.is_file():
                # the test finds its module by file name: point it at the copy
                text = test.read_text().replace(f"{src.stem}.py", dest.name)
                dest.with_name(f"test_{dest.stem}.py").write_text(text)
            index = [e for e in self._read_index() if e["path"] != entry["path"]]
            self._write_index(index + [entry])
        log.info("registered %s as %s", src, dest)
        return dest

    def entries(self, signature: str | None = None) -> list[dict]:
        """Index entries (``path`` made absolute), all or those of one signature."""
        found = [dict(e, path=str(self.root / e["path"])) for e in self._read_index()]
        return [e for e in found if signature is None or e["signature"] == signature]

    def usable(self, signature: str, device: str | torch.device | None = None) -> list[dict]:
        """Approved entries for this signature that can run on the device, highest speedup first."""
        try:
            kind, cap = device_key(device)
        except RegistryError as e:
            log.info("no usable kernel: %s", e)
            return []
        found = [e for e in self.entries(signature) if e.get("approved") and e.get("device") == kind
                 and (e.get("capability") == cap if kind == "cuda" else True) and Path(e["path"]).is_file()]
        return sorted(found, key=lambda e: -e["speedup"] if isinstance(e.get("speedup"), (int, float)) else 1.0)

    def best(self, signature: str, device: str | torch.device | None = None) -> dict | None:
        """The approved entry with the highest speedup usable on the device (CUDA: the same capability), or None."""
        found = self.usable(signature, device)
        return found[0] if found else None

    def remove(self, candidate_sha_prefix: str) -> int:
        """Remove every entry whose candidate sha starts with the prefix, and its files; returns how many."""
        if not candidate_sha_prefix:
            raise RegistryError("an empty prefix would remove every entry")
        with self._locked():
            index = self._read_index()
            gone = [e for e in index if str(e.get("candidate_sha", "")).startswith(candidate_sha_prefix)]
            for e in gone:
                path = self.root / e["path"]
                for f in (path, path.with_name(f"test_{path.stem}.py")):
                    f.unlink(missing_ok=True)
                for folder in (path.parent, path.parent.parent):
                    with contextlib.suppress(OSError):  # not empty: other entries live there
                        folder.rmdir()
            if gone:
                self._write_index([e for e in index if e not in gone])
        return len(gone)

    def _read_index(self) -> list[dict]:
        try:
            data = json.loads(self.index_path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as e:
            raise RegistryError(f"{self.index_path}: unreadable index: {e}") from e
        if not isinstance(data, list) or not all(isinstance(e, dict) and "path" in e and "signature" in e
                                                 for e in data):
            raise RegistryError(f"{self.index_path}: not a list of registry entries")
        return data

    def _write_index(self, index: list[dict]) -> None:
        tmp = self.index_path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(index, indent=1, default=str) + "\n")
        os.replace(tmp, self.index_path)  # readers see the old index or the new one, never half of one

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "w") as f:
            if fcntl is None:
                yield
                return
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
