"""Local worker pool: one worker per GPU (each child pinned with CUDA_VISIBLE_DEVICES), or N on the CPU."""
from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Sequence

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate import Baseline, Evaluator, Result
from kernelevolve.evaluate.evaluator import HeadToHeadError
from kernelevolve.evaluate.headtohead import HeadToHead
from kernelevolve.evaluate.result import ScreenResult
from kernelevolve.evaluate.screen import ScreenConfig, Screener

log = logging.getLogger(__name__)


def default_workers(device: str) -> int:
    if device == "cuda":
        import torch

        return max(1, torch.cuda.device_count())
    return 1  # CPU timings interfere with each other; more workers trade accuracy for throughput


def gpu_slots(device: str, workers: int) -> list[int | None]:
    """The GPU of each worker: the visible GPUs in turn (None on the CPU). More workers than GPUs share them, and
    then the timings of evaluations on one GPU disturb each other: a warning says so."""
    if device != "cuda":
        return [None] * workers
    import torch

    gpus = max(1, torch.cuda.device_count())
    if workers > gpus:
        log.warning("%d workers share %d GPU(s): evaluations timed at once on one GPU disturb each other's times",
                    workers, gpus)
    return [i % gpus for i in range(workers)]


class LocalPool:
    """Runs ``Evaluator.evaluate`` on worker threads; each evaluation is its own child process."""

    def __init__(self, evaluator: Evaluator, workers: int, screen: ScreenConfig | None = None):
        self.evaluator = evaluator
        self.screener = Screener(evaluator, screen)
        self.workers = workers
        self._slots: queue.Queue[int | None] = queue.Queue()
        self._gpus = gpu_slots(evaluator.config.device, workers)
        for gpu in self._gpus:
            self._slots.put(gpu)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kernelevolve-eval")
        self._screens: set[Future[list[ScreenResult]]] = set()  # batches submitted and not done

    def baseline(self, compiled: bool = True) -> Baseline:
        return self.evaluator.baseline(compiled=compiled)

    def head_to_head(self, candidate: Candidate, sides: Sequence[str]) -> HeadToHead:
        """The winner against the baselines ``sides`` on one worker's GPU (it holds that slot until the rounds end);
        a head-to-head that cannot be held comes back with its error."""
        gpu = self._slots.get()
        try:
            return self.evaluator.head_to_head(candidate, sides, gpu=gpu)
        except HeadToHeadError as e:
            return HeadToHead.failed(self.evaluator.config.timing.clock, str(e))
        finally:
            self._slots.put(gpu)

    def device_key(self) -> str:
        from kernelevolve.machine import device_key

        return device_key(self.evaluator.config.device)

    def submit(self, candidate: Candidate) -> Future[Result]:
        return self._pool.submit(self._run, candidate)

    def screen(self, candidates: list[Candidate]) -> Future[list[ScreenResult]]:
        """Screen a batch on one worker's GPU (it holds that slot until the batch is done)."""
        fut = self._pool.submit(self._screen, candidates)
        self._screens.add(fut)
        fut.add_done_callback(self._screens.discard)
        return fut

    def warm_screens(self, batch: int = 16) -> None:
        """Start the screen's processes for each GPU in the background, ahead of the first batch (of ``batch``)."""
        for gpu in dict.fromkeys(self._gpus):
            if self.screener.begin_warm(gpu):  # claimed here: a batch or shutdown() that comes first knows of it
                threading.Thread(target=self.screener.warm, args=(gpu, batch, True), daemon=True,
                                 name=f"kernelevolve-warm-{gpu}").start()

    def cancel_screens(self) -> None:
        """End the batches being screened (the search stopped): those not started yet are cancelled, and what the
        others had not screened comes back unscreened."""
        for fut in list(self._screens):
            fut.cancel()
        self.screener.cancel()

    def _screen(self, candidates: list[Candidate]) -> list[ScreenResult]:
        gpu = self._slots.get()
        try:
            return self.screener.screen(candidates, gpu=gpu)
        finally:
            self._slots.put(gpu)

    def _run(self, candidate: Candidate) -> Result:
        gpu = self._slots.get()
        try:
            return self.evaluator.evaluate(candidate, gpu=gpu)
        finally:
            self._slots.put(gpu)

    def shutdown(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=True)
        self.screener.close()
