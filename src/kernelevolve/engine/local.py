"""Local worker pool: one worker per GPU (each child pinned with CUDA_VISIBLE_DEVICES), or N on the CPU."""
from __future__ import annotations

import queue
from concurrent.futures import Future, ThreadPoolExecutor

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate import Baseline, Evaluator, Result


def default_workers(device: str) -> int:
    if device == "cuda":
        import torch

        return max(1, torch.cuda.device_count())
    return 1  # CPU timings interfere with each other; more workers trade accuracy for throughput


class LocalPool:
    """Runs ``Evaluator.evaluate`` on worker threads; each evaluation is its own child process."""

    def __init__(self, evaluator: Evaluator, workers: int):
        self.evaluator = evaluator
        self.workers = workers
        self._slots: queue.Queue[int | None] = queue.Queue()
        for i in range(workers):
            self._slots.put(i if evaluator.config.device == "cuda" else None)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kernelevolve-eval")

    def baseline(self, compiled: bool = True) -> Baseline:
        return self.evaluator.baseline(compiled=compiled)

    def device_key(self) -> str:
        from kernelevolve.optimize import device_key

        return device_key(self.evaluator.config.device)

    def submit(self, candidate: Candidate) -> Future[Result]:
        return self._pool.submit(self._run, candidate)

    def _run(self, candidate: Candidate) -> Result:
        gpu = self._slots.get()
        try:
            return self.evaluator.evaluate(candidate, gpu=gpu)
        finally:
            self._slots.put(gpu)

    def shutdown(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=True)
