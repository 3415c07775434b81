"""Modules of bench/, imported by path (bench/ is not a package): bench/suite.py for the tests that use its problem
list and SMALL copies, and the other benchmarks' pieces."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_bench(stem: str) -> ModuleType:
    """bench/STEM.py as the module ``bench_STEM``, imported once."""
    name = f"bench_{stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{stem}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the class is built
        spec.loader.exec_module(module)
    return sys.modules[name]


def load_suite() -> ModuleType:
    return load_bench("suite")
