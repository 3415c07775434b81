"""Executors: where evaluations run. Every pool offers the same small interface:

- ``workers``: how many evaluations it runs at once;
- ``submit(candidate) -> Future[Result]``: evaluate one candidate in a fresh process, under the harness's rules;
- ``screen(candidates) -> Future[list[ScreenResult]]``: check a batch once and time it briefly (evaluate/screen.py);
  it ranks candidates for ``submit`` and never verifies one;
- ``baseline(compiled=True) -> Baseline``: time the reference where the candidates run;
- ``head_to_head(candidate, sides) -> HeadToHead``: the winner and the baselines timed in interleaved rounds;
- ``device_key() -> str``: the device model that timings are comparable across;
- ``shutdown(wait=True)``.

``local`` runs child processes on this machine (one worker per GPU); ``ray`` sends each evaluation to a Ray cluster as
a task (engine/ray.py; Ray is an optional dependency).
"""
from __future__ import annotations

from typing import Any

from kernelevolve.engine.local import LocalPool, default_workers
from kernelevolve.evaluate import Evaluator
from kernelevolve.evaluate.screen import ScreenConfig

EXECUTORS = ("local", "ray")


class ExecutorError(Exception):
    """An executor that cannot start: a bad name, a missing optional dependency, an unreachable cluster."""


def make_pool(evaluator: Evaluator, workers: int | None = None, executor: str = "local",
              ray_address: str | None = None, ray_retries: int = 2, screen: ScreenConfig | None = None) -> Any:
    if executor == "local":
        return LocalPool(evaluator, workers or default_workers(evaluator.config.device), screen)
    if executor == "ray":
        from kernelevolve.engine.ray import RayPool

        return RayPool(evaluator, workers, address=ray_address, retries=ray_retries, screen=screen)
    raise ExecutorError(f"unknown executor {executor!r} (choose from {', '.join(EXECUTORS)})")


__all__ = ["EXECUTORS", "ExecutorError", "LocalPool", "default_workers", "make_pool"]
