"""bench/suite.py, imported by path for the tests that use its problem list and SMALL copies."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_suite() -> ModuleType:
    if "bench_suite" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_suite", ROOT / "bench" / "suite.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_suite"] = module  # dataclasses look their module up while the class is built
        spec.loader.exec_module(module)
    return sys.modules["bench_suite"]
