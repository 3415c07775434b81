"""The screen: many candidates checked once and timed briefly, so that the judge sees only the most promising.

A batch goes through two stages, each in child processes isolated like the judge's (their own process group, a hard
deadline per candidate, a scrubbed environment):

1. **check**: up to ``parallel`` processes share the batch. Each loads a candidate, calls it once on inputs drawn
   from one fresh seed and sends its outputs; the parent compares them with the reference it computed once for the
   batch. Triton and Inductor compile here, in parallel on the CPU cores, into their on-disk caches, at a lower CPU
   priority than the processes that time kernels.
2. **time**: one process loads each correct candidate again (its kernels now come from those caches) and times it
   briefly, the cache flushed before every repetition. One process, so that the timings do not disturb each other.

Each candidate is a command of its own, so a crash, a hang or a poisoned CUDA context names its candidate at once:
that candidate is recorded, its process replaced, and the rest of the batch goes on in a fresh one. A screen result
ranks candidates; it never makes one ``ok``. Only the judge (``Evaluator.evaluate``) does.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import statistics
import threading
import time
import weakref
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Callable, Iterator

import torch

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate.checks import compare_outputs
from kernelevolve.evaluate.evaluator import (_MALFORMED, Evaluator, _expect, _load_tensors, _raise_on_fail, _Verdict,
                                             cpu_of, fresh_seed)
from kernelevolve.evaluate.mismatch import mismatch_details
from kernelevolve.evaluate.process import Child, ChildDied, ChildTimeout
from kernelevolve.evaluate.result import ScreenResult, Status
from kernelevolve.evaluate.timing import TimingConfig
from kernelevolve.problem import input_specs
from kernelevolve.settings import DEFAULTS

log = logging.getLogger(__name__)

# Check processes at most, whatever the cores: each holds a CUDA context and a set of inputs on the device.
MAX_PARALLEL = 16
# Device memory a check process needs besides its inputs and outputs (its CUDA context, allocator slack).
PROCESS_BYTES = 1 << 30
# The check processes' CPU priority (a nice increment): they compile and check while another process may be timing a
# kernel (the judge, or another GPU's screen), whose launches must not wait for a core.
CHECK_NICE = 10
# Processes are kept between batches only for problems whose inputs and outputs take less than this.
KEEP_BYTES = 1 << 30
# Failures after which a process stays in use: what the candidate left behind, the next candidate's load finds.
_FIT_AFTER = {Status.COMPILE_ERROR, Status.INCORRECT}
# The status of a child that finds, loading a candidate, that an earlier one left it tampered with.
_UNFIT = "unfit"
# The tail of a failure's traceback or compiler message a screen result keeps (the feedback quotes the candidate's line).
ERROR_CHARS = 4000


@dataclass(frozen=True)
class ScreenConfig:
    timeout_s: float = DEFAULTS.screen_timeout_s  # per candidate and stage: an autotuning compile takes tens of s
    template_timeout_s: float = 30.0  # a template candidate's, on the GPU: one configuration compiles in seconds
    parallel: int | None = None  # check processes; None: from the CPU cores and the free device memory
    timing: TimingConfig = field(default_factory=lambda: TimingConfig(budget_ms=25.0, warmup_ms=5.0, min_reps=3,
                                                                      max_reps=100))
    input_sets: int = 2  # rotated through while timing
    # Keep the processes between batches (their torch, CUDA context and compiled kernels are ready for the next),
    # where one candidate's inputs and outputs are small enough that idle processes holding none cost little.
    keep_processes: bool = True
    # Build each candidate without nn.init's random fills where the reference's weights then replace every tensor it
    # holds (a failure is checked again, built in full); the judge always builds in full.
    quick_build: bool = True


OnScreened = Callable[[int, ScreenResult], None]


class _Ended(Enum):
    """How one child's share of a stage ended."""

    FIT = "fit"  # without a failure: the queue empty, a result after which the process is replaced, or cancel()
    WANT_FRESH = "want fresh"  # a kept child met a candidate only a fresh one may take: the next child is fresh
    FAILED = "failed"  # a candidate's failure, or the process's (``_ChildEnd.failure``)
    PARENT_FAILED = "parent failed"  # the parent's own side (out of memory, an OS error): this process stops


@dataclass(frozen=True)
class _ChildEnd:
    how: _Ended
    failure: ScreenResult | None = None  # FAILED: the candidate's in ``current``, or the process's where it holds None
    answered: int = 0  # FAILED: candidates the child had answered by then


class Screener:
    """Screens batches of candidates for the problem of ``evaluator``, whose reference, jobs and comparison it
    shares. Thread-safe like the evaluator: one batch per worker thread."""

    def __init__(self, evaluator: Evaluator, config: ScreenConfig | None = None):
        self.evaluator, self.config = evaluator, config or ScreenConfig()
        # where each recent batch's wall time went: candidates, check processes, seconds in each stage
        self.stats: deque[dict[str, float]] = deque(maxlen=256)
        self._batches: set[threading.Event] = set()  # the cancel flags of the batches in flight
        self._live: set[Child] = set()  # the children at work, for cancel()
        self._live_lock = threading.Lock()
        self._idle: dict[tuple[str, int | None], list[Child]] = {}  # kept between batches, by stage and GPU
        self._warming: dict[int | None, threading.Event] = {}  # set once warm() for that GPU is done
        self._closed = False  # processes started ahead after close() are not kept
        # the kept processes die with the screener (or at exit) if no one closes it
        self._finalizer = weakref.finalize(self, _kill_idle, self._idle, self._live_lock)

    def close(self) -> None:
        """Kill the processes kept between batches; those still being started ahead are killed once up. A later
        batch starts fresh ones (warm() may start them ahead again)."""
        with self._live_lock:
            self._closed = True
            self._warming.clear()
        _kill_idle(self._idle, self._live_lock)

    def begin_warm(self, gpu: int | None = None) -> bool:
        """Claim the warm-up of ``gpu`` before starting it on another thread, so that a batch or close() that comes
        first knows of it. False when it was claimed already."""
        with self._live_lock:
            if gpu in self._warming:
                return False
            self._closed = False
            self._warming[gpu] = threading.Event()
            return True

    def warm(self, gpu: int | None = None, batch: int = MAX_PARALLEL, claimed: bool = False) -> None:
        """Start the processes of the first batch (of ``batch`` candidates) ahead of it: torch imported, a CUDA
        context each, the problem loaded, so that the first batch, which the search waits on, does not pay for them.
        Where the processes would not be kept between batches (inputs and outputs past KEEP_BYTES) it starts none.
        Never raises: the first batch then starts its own. ``claimed``: begin_warm() was called for it."""
        if not claimed and not self.begin_warm(gpu):
            return
        with self._live_lock:
            done = self._warming.get(gpu)
        try:
            self._warm(gpu, batch)
        except Exception as e:  # the batch will start its own processes, and report what fails there
            log.warning("the screen's processes were not started ahead: %s: %s", type(e).__name__, str(e)[:200])
        finally:
            if done is not None:
                done.set()

    def _warm(self, gpu: int | None, batch: int) -> None:
        if not self.config.keep_processes:
            return
        ev = self.evaluator
        ev._release_cache(gpu)
        ref = ev._reference_with_room(fresh_seed(), 0, gpu)
        parallel, io_bytes = self._parallel(max(1, batch), ref, gpu)
        del ref
        ev._release_cache(gpu)
        if io_bytes >= KEEP_BYTES:
            return
        with self._live_lock:
            wanted = ["check"] * (parallel - len(self._idle.get(("check", gpu), []))) + \
                ["time"] * (1 - len(self._idle.get(("time", gpu), [])))

        def start(name: str) -> None:
            child = self._fresh_child(name, gpu)
            try:
                _expect(child, "hello")
                _expect(child, "loaded", send={"cmd": "load"})
                child.pause()
            except BaseException:
                child.kill()
                raise
            self._keep(name, gpu, child)

        if wanted:
            with ThreadPoolExecutor(max_workers=len(wanted), thread_name_prefix="kernelevolve-warm") as pool:
                list(pool.map(start, wanted))

    def _fresh_child(self, name: str, gpu: int | None) -> Child:
        job = self.evaluator._job("screen", gpu, f"screen_{name}_{fresh_seed() % 10**6}")
        job["screen_timing"] = asdict(self.config.timing)
        if name == "check":
            job["nice"] = CHECK_NICE
        child = Child(job, self.config.timeout_s)
        child.answered = 0  # candidates it has answered, over every batch
        return child

    def __enter__(self) -> "Screener":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _acquire(self, name: str, gpu: int | None) -> Child | None:
        """A kept child of this stage and GPU that is still alive (one that died waiting is nobody's fault)."""
        while True:
            with self._live_lock:
                kept = self._idle.get((name, gpu))
                child = kept.pop() if kept else None
            if child is None or child.proc.is_alive():
                return child
            child.kill()

    def _keep(self, name: str, gpu: int | None, child: Child) -> None:
        """Put a child that ended its share of a batch fit back for the next batch, emptied of its last candidate."""
        try:
            child.renew(self.config.timeout_s)
            _expect(child, "rested", send={"cmd": "screen_rest"})
            child.pause()
        except Exception:  # it cannot rest: not worth keeping
            child.kill()
            return
        with self._live_lock:
            kept = self._idle.setdefault((name, gpu), [])
            if len(kept) < MAX_PARALLEL and not self._closed:  # closed meanwhile (one started ahead): not kept
                kept.append(child)
                return
        child.kill()

    def cancel(self) -> None:
        """End the batches being screened now (the search stopped): their children are killed, and the candidates
        not yet screened come back marked as the screen's own failure (``harness``), blaming none of them. A batch
        that starts later is not affected."""
        with self._live_lock:
            for flag in self._batches:
                flag.set()
            for child in self._live:  # under the lock: a child its thread has let go of is not ours to kill
                child._kill_processes()

    def screen(self, candidates: list[Candidate], gpu: int | None = None,
               on_screened: OnScreened | None = None) -> list[ScreenResult]:
        """One ScreenResult per candidate, in their order. Never raises for a candidate's fault."""
        if not candidates:
            return []
        cancelled = threading.Event()  # this batch's: cancel() sets every batch's in flight
        with self._live_lock:
            self._batches.add(cancelled)
            warming = self._warming.get(gpu)
            self._closed = False
        ev = self.evaluator
        paths: list[str] = []
        try:
            if warming is not None:  # the processes being started ahead are this batch's
                until = time.monotonic() + self.config.timeout_s
                while not warming.wait(0.05) and not cancelled.is_set() and time.monotonic() < until:
                    pass
            for k, cand in enumerate(candidates):
                path = ev.workdir / f"screen_{cand.sha[:12]}_{fresh_seed() % 10**6}_{k}.py"
                path.write_text(cand.source)
                paths.append(str(path))
            if cancelled.is_set():
                return [ScreenResult(Status.RUNTIME_ERROR, "not screened: the search stopped first", harness=True)
                        for _ in candidates]
            return self._screen(candidates, paths, gpu, on_screened, cancelled)
        finally:
            with self._live_lock:
                self._batches.discard(cancelled)
            for p in paths:
                with contextlib.suppress(OSError):
                    os.unlink(p)

    def _screen(self, candidates: list[Candidate], paths: list[str], gpu: int | None,
                on_screened: OnScreened | None, cancelled: threading.Event) -> list[ScreenResult]:
        ev, n = self.evaluator, len(candidates)
        began = time.monotonic()
        seed = fresh_seed()
        ev._release_cache(gpu)
        ref = ev._reference_with_room(seed, 0, gpu)
        compute = ev._exact(seed, 0, gpu)
        exact = None if compute is None else _Once(compute)
        checked: dict[int, ScreenResult] = {}
        full_build: set[int] = set()  # candidates a quick build failed: checked again, built in full

        def check(child: Child, i: int) -> Any:
            r = self._check_one(child, paths[i], seed, ref, exact, gpu, self.config.quick_build and i not in full_build)
            if i in full_build and isinstance(r, ScreenResult):
                r.details["rebuilt"] = "its quick build failed the check; built in full"
            return r

        parallel, io_bytes = self._parallel(n, ref, gpu)
        keep = self.config.keep_processes and io_bytes < KEEP_BYTES
        if not keep:
            self.close()
        checking = time.monotonic()
        deadlines = [self._deadline(c) for c in candidates]
        checked.update(self._stage_all("check", list(range(n)), check, gpu,
                                       _Batch(keep, cancelled, deadlines=deadlines, full_build=full_build), parallel))
        timing_at = time.monotonic()
        for i in range(n):
            if on_screened is not None and not checked[i].ok:
                on_screened(i, checked[i])
        results = dict(checked)
        passed = [i for i in range(n) if checked[i].ok]
        timed = [i for i in passed if self._timeable(candidates[i])]
        if timed:
            seeds = ev._timing_seeds(gpu, self.config.input_sets)

            def time_one(child: Child, i: int) -> ScreenResult:
                return self._time_one(child, paths[i], seeds, checked[i])

            results.update(self._stage_all("time", timed, time_one, gpu,
                                           _Batch(keep, cancelled, deadlines=deadlines), 1))
        done = time.monotonic()
        self.stats.append({"candidates": n, "processes": parallel, "reference_s": checking - began,
                           "check_s": timing_at - checking, "time_s": done - timing_at, "timed": len(timed)})
        for i in passed:
            if on_screened is not None:
                on_screened(i, results[i])
        return [results[i] for i in range(n)]


    # --- stages -----------------------------------------------------------------------------------------------
    def _stage_all(self, name: str, indices: list[int], step: Callable[[Child, int], ScreenResult], gpu: int | None,
                   batch: "_Batch", processes: int) -> dict[int, ScreenResult]:
        """Run ``step`` for each index in ``processes`` children at once, which take the next index from one queue as
        each finishes its last: a candidate that is slow to compile holds up one process, not a share of the batch.
        What no process could take (the screen's own failure, or cancel()) is marked for the judge."""
        batch.todo = deque(indices)
        out: dict[int, ScreenResult] = {}
        if processes <= 1:
            out.update(self._stage(name, batch, step, gpu))
        else:
            with ThreadPoolExecutor(max_workers=processes, thread_name_prefix="kernelevolve-screen") as pool:
                for part in pool.map(lambda _: self._stage(name, batch, step, gpu), range(processes)):
                    out.update(part)
        if batch.todo:
            reason = "the search stopped first" if batch.cancelled.is_set() else (
                batch.failures[-1] if batch.failures else "no process took them")
            out.update(self._harness_failure(name, batch.todo, reason, quiet=batch.cancelled.is_set()))
        return out

    def _deadline(self, candidate: Candidate) -> float:
        """Seconds a candidate may take in one stage: a template candidate is one configuration, compiled without
        autotuning; on the GPU, one that takes longer than ``template_timeout_s`` is not worth the wait."""
        cfg = self.config
        if candidate.proposer == "template" and self.evaluator.config.device == "cuda":
            return min(cfg.timeout_s, cfg.template_timeout_s)
        return cfg.timeout_s

    def _stage(self, name: str, batch: "_Batch", step: Callable[[Child, int], ScreenResult],
               gpu: int | None) -> dict[int, ScreenResult]:
        """Take indices from ``batch.todo`` (shared with the stage's other processes) and run ``step`` for each in one
        child, replacing the child after a candidate that may have left it unfit (anything but a compile error or a
        wrong output), after one that reports it unfit (left behind by an earlier candidate: put back, for a fresh
        child), and after a crash or a hang, which are that candidate's result. The deadline runs only while the
        child works on a candidate. A child that fails on its own side stops this process: its candidate goes back
        to ``todo``, the reason to ``failures``; so does cancel()."""
        out: dict[int, ScreenResult] = {}
        fresh = False
        while batch.todo and not batch.cancelled.is_set():
            current: list[int | None] = [None]
            try:
                end = self._one_child(name, batch, step, gpu, out, current, fresh)
                fresh = end.how is _Ended.WANT_FRESH
            except (torch.OutOfMemoryError, OSError) as e:  # the parent's own side
                end = _ChildEnd(_Ended.PARENT_FAILED)
                batch.failures.append(f"{type(e).__name__}: {str(e)[:200]}")
            if batch.cancelled.is_set() or end.failure is None:
                if current[0] is not None:  # killed by cancel(), or the parent failed: no fault of its own
                    batch.todo.appendleft(current[0])
                if end.how in (_Ended.FIT, _Ended.WANT_FRESH) and not batch.cancelled.is_set():
                    continue  # the child ended fit, was replaced or met a candidate for a fresh one
                return out
            if current[0] is None:  # the process failed before or between candidates: no candidate's doing
                if not end.answered:
                    batch.failures.append(end.failure.reason)
                    return out
                continue
            out[current[0]] = end.failure
        return out

    def _one_child(self, name: str, batch: "_Batch", step: Callable[[Child, int], ScreenResult], gpu: int | None,
                   out: dict[int, ScreenResult], current: list[int | None],
                   force_fresh: bool = False) -> _ChildEnd:
        """One child's share of the stage, in a child kept from an earlier batch or a fresh one (how it ended: see
        ``_Ended``; a failure is that of the candidate in ``current``, or of the process when ``current`` holds
        None, with how many candidates the child has answered). A fresh child that reports itself unfit is the
        screen's own failure: OSError, as for the parent's own side. With ``batch.keep``, a child that ends fit is
        kept for the next batch. A kept child that dies on its first candidate of the batch may have died waiting:
        that candidate is put back for a fresh child (``batch.fresh_only``), and blamed only there."""
        child = self._acquire(name, gpu) if batch.keep and not force_fresh else None
        fresh = child is None
        if child is None:
            child = self._fresh_child(name, gpu)
        fit = False
        answered = 0  # in this batch
        todo = batch.todo
        try:
            with self._working(child):
                if fresh:
                    _expect(child, "hello")
                    _expect(child, "loaded", send={"cmd": "load"})
                    child.pause()
                while not batch.cancelled.is_set():
                    if child.expired:  # while the parent compared the last outputs: no candidate's doing
                        raise ChildTimeout()
                    try:
                        current[0] = todo.popleft()
                    except IndexError:
                        fit = True
                        break
                    i = current[0]
                    if not fresh and i in batch.fresh_only:  # another thread's kept child died on it
                        todo.appendleft(i)
                        current[0] = None
                        fit = True  # this child did nothing wrong; the next one for this thread is fresh
                        raise _WantFresh()
                    child.renew(batch.deadline(i))
                    r = step(child, i)
                    child.pause()
                    if isinstance(r, _Unfit):
                        todo.appendleft(i)
                        current[0] = None
                        if not child.answered:  # a fresh process cannot be unfit: the screen's own failure
                            raise OSError(f"a fresh screen process reports itself unfit: {r.reason}")
                        break  # again in a fresh process
                    if isinstance(r, _Again):  # again, built in full, with a deadline of its own
                        batch.full_build.add(i)
                        todo.appendleft(i)
                        current[0] = None
                        if r.status is Status.INCORRECT:
                            continue  # a wrong output leaves the process fit
                        break  # a failed call may leave it unfit: a fresh one takes the candidate
                    out[i] = r
                    current[0] = None
                    child.answered += 1
                    answered += 1
                    if r.status not in _FIT_AFTER and not r.ok:
                        break
            return _ChildEnd(_Ended.FIT)
        except _WantFresh:
            return _ChildEnd(_Ended.WANT_FRESH)
        except ChildTimeout:
            i = current[0]
            limit = self.config.timeout_s if i is None else batch.deadline(i)
            failure = ScreenResult(Status.TIMEOUT, f"no answer within {limit:g} s in the screen's {name} stage; "
                                                   "process group killed")
        except ChildDied as e:
            if not fresh and answered == 0 and current[0] is not None:
                batch.fresh_only.add(current[0])
                todo.appendleft(current[0])
                current[0] = None
                return _ChildEnd(_Ended.WANT_FRESH)
            failure = ScreenResult(Status.CRASHED, f"screen process {e} ({name} stage)")
        except _Verdict as v:
            failure = ScreenResult(v.status, v.reason, error=v.error[-ERROR_CHARS:])
        except _MALFORMED as e:
            failure = ScreenResult(Status.REJECTED, f"protocol violation: malformed message ({type(e).__name__})")
        finally:
            if fit and batch.keep and not batch.cancelled.is_set():
                self._keep(name, gpu, child)
            else:  # out of _live by now: cancel() no longer touches it
                child.kill()
        return _ChildEnd(_Ended.FAILED, failure, child.answered)

    @contextlib.contextmanager
    def _working(self, child: Child) -> Iterator[Child]:
        with self._live_lock:
            self._live.add(child)
        try:
            yield child
        finally:
            with self._live_lock:
                self._live.discard(child)

    @staticmethod
    def _harness_failure(name: str, todo: deque[int], reason: str, quiet: bool = False) -> dict[int, ScreenResult]:
        """The candidates left in ``todo``, marked for the judge; ``quiet`` for a batch cancelled on purpose."""
        if not todo:
            return {}
        (log.info if quiet else log.warning)("the screen's %s stage left %d candidate(s) unscreened: %s", name,
                                             len(todo), reason)
        return {i: ScreenResult(Status.RUNTIME_ERROR, f"not screened: the screen's {name} stage failed: {reason}",
                                harness=True) for i in todo}

    def _check_one(self, child: Child, path: str, seed: int, ref: tuple[torch.Tensor, ...], exact: "_Once | None",
                   gpu: int | None, quick: bool = True) -> Any:
        """Check a candidate, built quickly if ``quick`` (the child skips nn.init's random fills where the reference's
        weights replace every tensor it holds). A quick build whose outputs are wrong or whose call fails is
        ``_Again``: the stage checks it again, built in full, so that the shortcut screens out no honest candidate."""
        child.send({"cmd": "screen_check", "candidate": path, "seed": seed, "quick": quick})
        header, blob = child.recv()
        quick = bool(header.get("quick"))  # the build the child made: quick only where it skipped a random fill
        if header.get("msg") == "fail":
            failed = _failure(header)
            return _Again(failed.status) if quick and failed.status in _AGAIN else failed
        _raise_on_fail(header, "output")
        first = header.get("first_call_s")
        first = float(first) if isinstance(first, (int, float)) else None
        problem = self.evaluator.problem
        outs = _load_tensors(header, blob, torch.device(self.evaluator._ref_device(gpu)))
        reason = compare_outputs(ref, outs, problem.allow_tf32, problem.atol, problem.rtol, exact)
        if reason and quick:
            return _Again(Status.INCORRECT)
        if reason:  # the float64 reference, if any, is the batch's, computed once: the report costs one more pass
            return ScreenResult(Status.INCORRECT, reason, first_call_s=first, details=mismatch_details(
                ref, outs, problem.allow_tf32, problem.atol, problem.rtol, exact))
        # its timing builds it the same way
        return ScreenResult(Status.OK, "checked once; untimed", first_call_s=first,
                            details={"build": "quick"} if quick else {})

    def _time_one(self, child: Child, path: str, seeds: list[int], checked: ScreenResult) -> ScreenResult:
        timed_at = round(time.time(), 3)
        child.send({"cmd": "screen_time", "candidate": path, "seeds": seeds,
                    "quick": checked.details.get("build") == "quick"})
        header, _ = child.recv()
        if header.get("msg") == "fail":
            failed = _failure(header)
            if isinstance(failed, _Unfit):
                return failed
            return ScreenResult(failed.status, f"timing: {failed.reason}", first_call_s=checked.first_call_s)
        _raise_on_fail(header, "screen_timed")
        samples = [float(x) for x in header["samples_ms"]]
        if not samples or not all(math.isfinite(x) and x >= 0 for x in samples):
            return ScreenResult(Status.REJECTED, "timing: no usable samples", first_call_s=checked.first_call_s)
        host = header.get("host_ms")
        details = {k: v for k, v in checked.details.items() if k != "build"}  # the build this timing made
        if header.get("quick"):
            details["build"] = "quick"
        if cpu := cpu_of(header):
            details["cpu"] = cpu
        return ScreenResult(Status.OK, f"checked once, timed over {len(samples)} repetitions",
                            ms=statistics.median(samples), first_call_s=checked.first_call_s,
                            host_ms=float(host) if isinstance(host, (int, float)) and math.isfinite(host) else None,
                            timed_at=timed_at, details=details)

    # --- planning -----------------------------------------------------------------------------------------------
    def _timeable(self, candidate: Candidate) -> bool:
        """Its timing means something: not Triton under the CPU interpreter."""
        cfg = self.evaluator.config
        return cfg.time_candidates and not (cfg.device == "cpu" and candidate.language == "triton")

    def _parallel(self, n: int, ref: tuple[torch.Tensor, ...], gpu: int | None) -> tuple[int, int]:
        """Check processes: the configured number, else one per CPU core (up to MAX_PARALLEL), as many as the free
        device memory holds with one input set and the outputs each; and the bytes of one call's inputs and
        outputs."""
        ev = self.evaluator
        seed = fresh_seed()
        specs = input_specs(ev.module, seed, 0, "meta", meta_only=True) or input_specs(
            ev.module, seed, 0, ev._ref_device(gpu))  # sizes drawn from values (jagged): drawn for real
        in_bytes = sum(math.prod(shape) * dtype.itemsize for shape, dtype in filter(None, specs))
        out_bytes = sum(t.numel() * t.element_size() for t in ref)
        io_bytes = in_bytes + out_bytes
        if self.config.parallel is not None:
            return max(1, min(n, self.config.parallel)), io_bytes
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        most = max(1, min(n, cores, MAX_PARALLEL))
        if ev.config.device != "cuda" or not torch.cuda.is_available():
            return most, io_bytes
        with torch.cuda.device(ev._ref_device(gpu)):
            free = torch.cuda.mem_get_info()[0]
        each = PROCESS_BYTES + in_bytes + 3 * out_bytes
        return max(1, min(most, int(0.6 * free // each))), io_bytes


def _kill_idle(idle: dict[tuple[str, int | None], list[Child]], lock: threading.Lock) -> None:
    with lock:
        children = [c for kept in idle.values() for c in kept]
        idle.clear()
    for child in children:
        child.kill()


@dataclass(eq=False)
class _Batch:
    """What the processes of one stage of one batch share."""

    keep: bool  # keep fit processes for the next batch
    cancelled: threading.Event
    todo: deque[int] = field(default_factory=deque)  # the indices no process has taken yet
    failures: list[str] = field(default_factory=list)  # the screen's own failures, for the report
    fresh_only: set[int] = field(default_factory=set)  # indices a kept process died on: for fresh processes only
    deadlines: list[float] = field(default_factory=list)  # seconds per candidate and stage
    full_build: set[int] = field(default_factory=set)  # indices a quick build failed: built in full from then on

    def deadline(self, i: int) -> float:
        return self.deadlines[i]


class _WantFresh(Exception):
    """A kept child met a candidate that only a fresh child may take."""


class _Once:
    """The float64 reference as compare_outputs takes it, computed at most once for the whole batch."""

    def __init__(self, compute: Callable[[], Any]):
        self.compute, self.value, self.done = compute, None, False
        self.lock = threading.Lock()

    def __call__(self) -> Any:
        with self.lock:
            if not self.done:
                self.value, self.done = self.compute(), True
            return self.value


def _failure(header: dict[str, Any]) -> Any:
    if header.get("status") == _UNFIT:
        return _Unfit(str(header.get("reason", ""))[:300])
    try:
        status = Status(header.get("status"))
    except ValueError:
        status = Status.RUNTIME_ERROR
    if status is Status.OK:
        status = Status.REJECTED
    return ScreenResult(status, str(header.get("reason", ""))[:300], error=str(header.get("error", ""))[-ERROR_CHARS:])




# a quick build's failures that a full build may not share: its outputs wrong, or its call failing
_AGAIN = (Status.INCORRECT, Status.RUNTIME_ERROR)


@dataclass(frozen=True)
class _Again:
    """A quickly built candidate that failed with ``status``: not its result; the stage checks it again, built in
    full."""

    status: Status
    ok: bool = False


@dataclass(frozen=True)
class _Unfit:
    """A child's answer that an earlier candidate left it unfit: not this candidate's result."""

    reason: str
    status: str = _UNFIT
    ok: bool = False
