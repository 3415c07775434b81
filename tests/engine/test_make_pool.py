"""make_pool's choices, and the Ray executor when Ray is not installed."""
from __future__ import annotations

import importlib
import sys

import pytest

import kernelevolve.engine
from kernelevolve.engine import ExecutorError, LocalPool, make_pool
from kernelevolve.engine.local import gpu_slots
from kernelevolve.evaluate import EvalConfig


class _Evaluator:
    config = EvalConfig(device="cpu")


def test_local_and_unknown():
    pool = make_pool(_Evaluator(), 2)
    assert isinstance(pool, LocalPool) and pool.workers == 2
    pool.shutdown()
    with pytest.raises(ExecutorError, match="unknown executor 'dask'"):
        make_pool(_Evaluator(), executor="dask")


def test_ray_missing_gives_the_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    monkeypatch.delitem(sys.modules, "kernelevolve.engine.ray", raising=False)
    monkeypatch.delattr(kernelevolve.engine, "ray", raising=False)
    importlib.import_module("kernelevolve.engine.ray")  # the module itself imports without Ray
    with pytest.raises(ExecutorError, match=r'pip install "kernelevolve\[ray\]"'):
        make_pool(_Evaluator(), executor="ray", ray_address="127.0.0.1:6379")


def test_workers_take_the_visible_gpus_in_turn(monkeypatch, caplog):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert gpu_slots("cuda", 2) == [0, 1] and not caplog.records
    assert gpu_slots("cuda", 1) == [0]
    assert gpu_slots("cuda", 3) == [0, 1, 0]  # never an index past the visible GPUs
    assert "3 workers share 2 GPU(s)" in caplog.text
    assert gpu_slots("cpu", 2) == [None, None]
