"""The parent side of evaluation: draws seeds, computes reference outputs, drives one child per candidate, judges."""
from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import statistics
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, Sequence

import torch

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate import devshare
from kernelevolve.evaluate.checks import compare_outputs
from kernelevolve.evaluate.headtohead import (CANDIDATE, COMPILE_OPTIONS, CPU_MARGIN, GPU_FLOOR_MS, MARGIN,
                                              SIDES, HeadToHead, decide)
from kernelevolve.evaluate.mismatch import mismatch_details
from kernelevolve.evaluate.process import Child, ChildDied, ChildTimeout
from kernelevolve.evaluate.result import Baseline, Result, Status, Timing
from kernelevolve.evaluate.timing import TimingConfig, loop_ms
from kernelevolve.problem import (Problem, StateSlots, as_outputs, build_model, import_module_from_path,
                                 input_specs, make_inputs)
from kernelevolve.settings import BASELINES

log = logging.getLogger(__name__)
Buffer = bytes | bytearray | memoryview

# The parent's view of the measured loop may exceed what the child reports by this factor, plus the calibrated
# per-repetition cost of the loop itself (a no-op over the same inputs), plus a fixed allowance, before the timings
# are called forged. On the H200 the loop around a real ~0.1 ms kernel cost up to ~0.5 ms more per repetition than
# around the no-op (host wake-up after each device sync), hence SYNC_ALLOWANCE_MS for CUDA.
WALL_SLACK = 2.0
LOOP_SLACK = 1.5
WALL_ALLOWANCE_S = 0.25
SYNC_ALLOWANCE_MS = {"cuda-events": 1.0, "perf_counter": 0.0}
# A loop over the allowance is timed again before the verdict: once, an honest 256 MB candidate's loop on a loaded
# 2-core machine took 3.91 s by the parent's clock against 1.39 s of runs (3.47 s allowed). Forged or hidden timing
# is over it every time.
WALL_TRIES = 2
# A side stream is suspected when device-idle time exceeds stream time by more than the calibrated sync latency
# plus this much (ms) or this fraction of the stream time.
SIDE_STREAM_MS, SIDE_STREAM_FRAC = 0.1, 0.5
# Reference outputs this large (bytes) hand the device memory their computation cached back before the child's call
LARGE_BYTES = 1 << 30
# Rounds of a head-to-head (the sign test bounds a median of 10 between the 2nd and 9th: 97.9%)
ROUNDS = 10
# Timed repetitions whose outputs are checked, at positions the child learns only when timing starts.
CHECKED_REPS = 2
# Fresh draws the ghost run (Triton kernels disabled) may take to find an informative one: a draw whose output needs
# no kernel (an empty jagged batch) cannot tell an honest candidate from a ghost and is skipped.
GHOST_DRAWS = 4
# What reading a header with missing or ill-typed fields raises.
_MALFORMED = (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError)


SAME_SHAPE_TRIES = 64
# Draws beyond the first whose shapes must all agree before a problem's shapes count as fixed.
VARYING_DRAWS = 6


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") & (2**63 - 1)


@dataclass(frozen=True)
class EvalConfig:
    device: str = "cpu"
    timeout_s: float = 300.0
    trials: int = 3
    timing: TimingConfig = field(default_factory=TimingConfig)
    time_candidates: bool = True
    # CUDA outputs of at least this many bytes come back on the device, by IPC handle (None: always by host memory)
    share_min_bytes: int | None = devshare.MIN_BYTES


class JudgeSettings(Protocol):
    """The judge's settings as a run's configuration holds them (``OptimizeConfig`` does)."""

    device: str
    timeout_s: float
    trials: int
    timing_budget_ms: float
    timing: str  # the clock that ranks kernels: "call" or "graph"


def make_evaluator(problem: Problem, cfg: JudgeSettings, workdir: str | Path | None = None) -> "Evaluator":
    timing = TimingConfig(budget_ms=cfg.timing_budget_ms, clock=cfg.timing)
    return Evaluator(problem, EvalConfig(device=cfg.device, timeout_s=cfg.timeout_s, trials=cfg.trials, timing=timing),
                     workdir)


class HeadToHeadError(Exception):
    """A head-to-head that could not be held (a side failed to load or time), or whose candidate failed a check."""


class _Verdict(Exception):
    def __init__(self, status: Status, reason: str, error: str = ""):
        super().__init__(reason)
        self.status, self.reason, self.error = status, reason, error


class Evaluator:
    """Evaluates candidates for one problem on one device. Thread-safe: one call per worker thread."""

    def __init__(self, problem: Problem, config: EvalConfig, workdir: str | Path | None = None):
        self.problem, self.config = problem, config
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="kernelevolve-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.module = import_module_from_path(problem.path, f"_ke_reference_{problem.short_sha}")
        self.init_seed = fresh_seed()
        self.state_path = self.workdir / "reference_state.pt"
        torch.save(build_model(self.module, "Model", self.init_seed).state_dict(), self.state_path)
        self._models: dict[str, torch.nn.Module] = {}
        self._slots: dict[int, StateSlots] = {}  # by id of model: the state its forward writes, and its initial values
        self._lock = threading.Lock()
        self._state_lock = threading.Lock()  # a stateful reference is reset, called and read by one thread at a time
        self._varying: bool | None = None  # whether input shapes change between draws; found at the first re-call

    # --- reference ------------------------------------------------------------------------------------------
    def _ref_device(self, gpu: int | None) -> str:
        return f"cuda:{gpu or 0}" if self.config.device == "cuda" else "cpu"

    def _model(self, dev: str, exact: bool = False) -> torch.nn.Module:
        key = f"{dev}:float64" if exact else dev
        with self._lock:
            if key not in self._models:
                model = build_model(self.module, "Model", self.init_seed).to(dev)
                self._models[key] = model.double() if exact else model
                if self.problem.mutated_state:
                    self._slots[id(self._models[key])] = StateSlots(self._models[key], self.problem.mutated_state)
            return self._models[key]

    def _called(self, model: torch.nn.Module, inputs: list[Any]) -> tuple[Any, ...]:
        """The model's outputs on ``inputs``; for a model whose forward writes its state, called from the initial state,
        with that state after the call appended (the candidate's must match it)."""
        slots = self._slots.get(id(model))
        if slots is None:
            return as_outputs(model(*inputs))
        with self._state_lock:
            slots.reset()
            return as_outputs(model(*inputs)) + slots.values()

    def _inputs(self, seed: int, shape: int, dev: str, host: bool) -> list[Any]:
        """The inputs drawn with ``seed`` on the reference device (the values the child draws), moved to the host
        one by one when ``host``."""
        inputs = make_inputs(self.module, seed, shape, dev)
        if host:
            for k, v in enumerate(inputs):
                inputs[k] = v.cpu() if isinstance(v, torch.Tensor) else v
        return inputs

    def reference(self, seed: int, shape: int = 0, gpu: int | None = None,
                  host: bool = False) -> tuple[torch.Tensor, ...]:
        """The reference outputs for the inputs drawn with ``seed``, on the reference device (where outputs are
        compared, while that worker's child waits), or computed on the host when ``host``. Never sent to a child."""
        dev = self._ref_device(gpu)
        inputs = self._inputs(seed, shape, dev, host)
        model = self._model("cpu" if host else dev)
        with torch.no_grad():
            # Both flags, as in the child: cuDNN convolutions default to TF32 (allow_tf32=True) otherwise.
            torch.backends.cuda.matmul.allow_tf32 = self.problem.allow_tf32
            torch.backends.cudnn.allow_tf32 = self.problem.allow_tf32
            outs = self._called(model, inputs)
        if self.problem.mutates_inputs:  # the mutated inputs are part of the result
            outs = outs + tuple(v for v in inputs if isinstance(v, torch.Tensor))
        return tuple(o.detach() for o in outs)

    def reference_exact(self, seed: int, shape: int = 0, gpu: int | None = None) -> tuple[torch.Tensor, ...] | None:
        """The reference in float64 (weights and floating inputs upcast) for the inputs drawn with ``seed``: how far
        the reference itself is from the exact result. On the host where the device has no room for it (float64 takes
        twice the memory); None where its ops do not run in float64."""
        try:
            return self._exact_on(seed, shape, gpu, host=False)
        except torch.OutOfMemoryError:
            self._release_cache(gpu)
        except Exception as e:  # the reference's own code: any op that has no float64 kernel
            log.debug("no float64 reference: %s: %s", type(e).__name__, e)
            return None
        try:
            return self._exact_on(seed, shape, gpu, host=True)
        except Exception as e:
            log.debug("no float64 reference on the host: %s: %s", type(e).__name__, e)
            return None

    def _exact_on(self, seed: int, shape: int, gpu: int | None, host: bool) -> tuple[torch.Tensor | None, ...]:
        inputs = self._inputs(seed, shape, self._ref_device(gpu), host)
        for k, v in enumerate(inputs):  # one at a time, so a float32 input and its float64 copy overlap only briefly
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                inputs[k] = v.double()
        model = self._model("cpu" if host else self._ref_device(gpu), exact=True)
        with torch.no_grad():
            outs = self._called(model, inputs)
        if self.problem.mutates_inputs:
            outs = outs + tuple(v for v in inputs if isinstance(v, torch.Tensor))
        return tuple(o.detach() if isinstance(o, torch.Tensor) else None for o in outs)

    def _exact(self, seed: int, shape: int, gpu: int | None, count: int | None = None) -> Any:
        """The float64 reference as compare_outputs takes it, computed at most once (a failed comparison's mismatch
        report reads it again); None when the problem sets its own tolerances."""
        if self.problem.atol is not None or self.problem.rtol is not None:
            return None
        memo: list[tuple[torch.Tensor, ...] | None] = []

        def compute() -> tuple[torch.Tensor, ...] | None:
            if not memo:
                outs = self.reference_exact(seed, shape, gpu)
                memo.append(outs if outs is None or count is None else outs[:count])
            return memo[0]

        return compute

    def _input_shapes(self, seed: int, shape: int, gpu: int | None) -> list[Any]:
        return input_specs(self.module, seed, shape, self._ref_device(gpu))

    def _same_shapes_seed(self, seed: int, shape: int, gpu: int | None) -> int | None:
        """A fresh seed whose inputs have the shapes ``seed`` drew, for the re-call into the same buffers. Only
        problems whose shapes change from draw to draw (jagged totals) need more than one try."""
        want = self._input_shapes(seed, shape, gpu)
        if self._varying is None:  # a jagged problem's totals from a small range repeat by chance: many draws
            self._varying = any(self._input_shapes(fresh_seed(), shape, gpu) != want for _ in range(VARYING_DRAWS))
        if not self._varying:
            s = fresh_seed()
            specs = input_specs(self.module, s, shape, meta_only=True)
            if specs == want:  # on the meta device, checked every time at no cost
                return s
            if specs is None and self._input_shapes(s, shape, gpu) == want:  # drawn only for real: checked too, as
                return s  # VARYING_DRAWS agreeing draws can be chance (a total of 0 or 1 rows agrees 1 time in 32)
            self._varying = True
        for _ in range(SAME_SHAPE_TRIES):
            s = fresh_seed()
            if self._input_shapes(s, shape, gpu) == want:
                return s
        return None

    def _timing_seeds(self, gpu: int | None, n: int = 3) -> list[int]:
        """Input sets to rotate through while timing; they refill one set of buffers, so their shapes must agree."""
        seeds = [fresh_seed()]
        while len(seeds) < n:
            s = self._same_shapes_seed(seeds[0], 0, gpu)
            if s is None:
                break
            seeds.append(s)
        return seeds

    # --- jobs -----------------------------------------------------------------------------------------------
    def _job(self, mode: str, gpu: int | None, name: str, candidate: Candidate | None = None) -> dict[str, Any]:
        job = {"mode": mode, "device": self.config.device, "gpu": gpu, "problem": self.problem.path,
               "state_dict": str(self.state_path), "init_seed": self.init_seed, "log": str(self.workdir / f"{name}.log"),
               "allow_tf32": self.problem.allow_tf32, "mutates_inputs": self.problem.mutates_inputs,
               "mutated_state": list(self.problem.mutated_state), "timing": asdict(self.config.timing),
               "share_min_bytes": self.config.share_min_bytes}
        if candidate is not None:
            path = self.workdir / f"{name}.py"
            path.write_text(candidate.source)
            job.update(candidate=str(path), language=candidate.language)
        return job

    def evaluate(self, candidate: Candidate, gpu: int | None = None) -> Result:
        """Run every check on ``candidate`` in a fresh process and time it. Never raises for candidate faults."""
        name = f"cand_{candidate.sha[:12]}_{fresh_seed() % 10**6}"
        job = self._job("candidate", gpu, name, candidate)
        details: dict[str, Any] = {}
        t0 = time.perf_counter()
        self._release_cache(gpu)  # what earlier references left cached is the child's to plan with
        try:
            with Child(job, self.config.timeout_s) as child:
                result = self._drive(child, candidate, gpu, details)
        except _Verdict as v:
            result = Result(status=v.status, reason=v.reason, error=v.error, details=details)
        except ChildTimeout:
            result = Result(Status.TIMEOUT, f"no answer within {self.config.timeout_s:g} s; process group killed",
                            details=details)
        except ChildDied as e:
            result = Result(Status.CRASHED, f"candidate process {e}", details=details)
        except torch.OutOfMemoryError as e:  # the judge's own side, after its host fallbacks: not the candidate's fault
            result = Result(Status.RUNTIME_ERROR, f"the judge ran out of device memory checking the outputs: "
                                                  f"{str(e).splitlines()[0][:200]}", error=traceback.format_exc(),
                            details=details)
        except _MALFORMED as e:  # the candidate can write to its own end of the channel
            result = Result(Status.REJECTED, f"protocol violation: malformed message ({type(e).__name__}: {e})"[:300],
                            error=traceback.format_exc(), details=details)
        return replace(result, wall_s=time.perf_counter() - t0, log=_tail(Path(job["log"])))

    def _drive(self, child: Child, cand: Candidate, gpu: int | None, details: dict[str, Any]) -> Result:
        clock = _PhaseClock(details.setdefault("phases_s", {}))
        _expect(child, "hello")
        clock("start")
        loaded = _expect(child, "loaded", send={"cmd": "load"})
        clock("load")
        details.update(load_s=loaded["load_s"], kernels=loaded["kernels"], weights=loaded["weights"])
        own_kernels = cand.language == "triton" or bool(loaded["kernels"])
        outputs, last, returned = None, 0, [] if own_kernels else None  # the fingerprints only the ghost run reads
        for trial in range(self.config.trials):
            for shape in range(self.problem.n_shapes):
                last = fresh_seed()
                outputs = self._check_trial(child, "trial", shape, gpu, f"trial {trial + 1} shape {shape}", last,
                                            details, returned)
        # the re-call refills the buffers of the last trial, which used the last shape
        recall = self._same_shapes_seed(last, self.problem.n_shapes - 1, gpu)
        if recall is None:
            details["recall"] = "skipped: no draw with the last trial's input shapes was found"
        else:
            self._check_trial(child, "recall", self.problem.n_shapes - 1, gpu,
                              "re-call with new values in the same input buffers", recall, details, returned)
        clock("trials")
        details["first_call_s"] = outputs.get("first_call_s") if outputs else None  # timing may refine it
        launches = outputs["launches"] if outputs else 0
        if own_kernels:
            if launches == 0:
                raise _Verdict(Status.REJECTED, "defines Triton kernels but launched none of them")
            self._ghost(child, gpu, returned=returned)
            clock("ghost")
        timing_ = None
        interpreted = self.config.device == "cpu" and own_kernels
        if self.config.time_candidates and not interpreted:
            timing_ = self._time(child, details, gpu)
            clock("timing")
            self._check_trial(child, "trial", 0, gpu, "post-timing check", details=details)
            clock("post_check")
            if self.config.device == "cuda" and "side_stream" not in details:
                timing_ = self._graph(child, timing_, gpu, details)
                clock("graph")
        try:
            child.send({"cmd": "done"})
        except ChildDied:
            if not timing_ or not timing_.graph_note.startswith("failed"):
                raise  # else the child ended with its graph replay's failure, after every check had passed
        reason = "verified" + ("" if timing_ else (
            "; untimed: Triton interpreter timings are meaningless" if interpreted else "; untimed"))
        return Result(Status.OK, reason, timing=timing_, timed=timing_ is not None, load_s=loaded["load_s"],
                      compile_s=details.get("first_call_s"), details=details)

    def _output(self, child: Child, cmd: dict[str, Any], gpu: int | None) -> tuple[dict[str, Any], Buffer, tuple]:
        """Send a command that produces outputs, the reference computed first. Its peak (inputs, outputs and
        whatever the reference allocates on the way) is over, and where its outputs are large handed back to the
        device, before the child's call allocates: a call of 16 GB each way fits on an 80 GB card beside the
        reference's outputs, where the two peaks at once would not."""
        try:
            ref = self.reference(cmd["seed"], cmd["shape"], gpu)
            if sum(r.numel() * r.element_size() for r in ref if isinstance(r, torch.Tensor)) >= LARGE_BYTES:
                self._release_cache(gpu)
        except torch.OutOfMemoryError:
            ref = None  # no room beside what the child holds: again once its call is over
        child.send(cmd)
        header, blob = child.recv()
        _raise_on_fail(header, "output")
        return header, blob, ref if ref is not None else self._reference_with_room(cmd["seed"], cmd["shape"], gpu)

    def _reference_with_room(self, seed: int, shape: int, gpu: int | None) -> tuple[torch.Tensor, ...]:
        """The reference while the child waits: again after the cached memory is handed back, on the host if the
        device still has no room for it."""
        for _ in range(2):
            try:
                return self.reference(seed, shape, gpu)
            except torch.OutOfMemoryError:
                self._release_cache(gpu)
        log.info("no device memory for the reference outputs: computed on the host")
        return self.reference(seed, shape, gpu, host=True)

    def _compare(self, ref: tuple, outs: tuple, exact: Any = None, details: dict[str, Any] | None = None) -> str | None:
        """compare_outputs with the problem's tolerances; where the outputs are wrong and ``details`` is given, the
        mismatch report goes into it."""
        p = self.problem
        reason = compare_outputs(ref, outs, p.allow_tf32, p.atol, p.rtol, exact, p.rounded_in)
        if reason and details is not None:
            details.update(mismatch_details(ref, outs, p.allow_tf32, p.atol, p.rtol, exact, p.rounded_in))
        return reason

    def _check_trial(self, child: Child, cmd: str, shape: int, gpu: int | None, what: str,
                     seed: int | None = None, details: dict[str, Any] | None = None,
                     fingerprints: list[tuple[int, ...] | None] | None = None) -> dict[str, Any]:
        """One judged call on a fresh draw (``seed``); the bits of its outputs go into ``fingerprints`` if given."""
        seed = fresh_seed() if seed is None else seed
        header, blob, ref = self._output(child, {"cmd": cmd, "seed": seed, "shape": shape}, gpu)
        if details is not None:
            _note_peak(details, header.get("peak_bytes"))
        outs = _shared_back(child, header, _load_tensors(header, blob, _device_of(ref)))
        reason = self._compare(ref, outs, self._exact(seed, shape, gpu), details)
        if reason:
            raise _Verdict(Status.INCORRECT, f"{what}: {reason}")
        if fingerprints is not None:
            fingerprints.append(_fingerprint(outs[:len(self.problem.output_dtypes) or len(outs)]))
        return header

    def _ghost(self, child: Child, gpu: int | None, draws: int = GHOST_DRAWS,
               returned: list[tuple[int, ...] | None] | None = None) -> None:
        """With its Triton kernels disabled, the candidate must be wrong on the first informative fresh draw. A draw
        cannot tell an honest kernel from none, and is skipped, where its reference output is empty or all zeros (an
        empty jagged batch needs no kernel at all), or where the ghost run's outputs are, bit for bit, outputs the
        candidate returned earlier (``returned``: the judged calls' fingerprints) and still pass: an earlier call's
        output left in the memory the ghost run reuses, right again for a problem whose outputs hardly depend on the
        inputs (KernelBench's Gemm_LogSumExp). Up to ``draws`` draws; a problem whose draws are all of those kinds
        passes the check. Outputs computed afresh some other way differ in their bits, and are rejected."""
        for _ in range(draws):
            header, blob, ref = self._output(child, {"cmd": "ghost", "seed": fresh_seed(), "shape": 0}, gpu)
            if header.get("ghost_error"):
                return
            outs = _shared_back(child, header, _load_tensors(header, blob, _device_of(ref)))
            if self._compare(ref, outs) is not None:
                return
            n = len(self.problem.output_dtypes) or len(ref)  # the outputs, not state or inputs
            if _informative(ref[:n]) and (returned is None or _fingerprint(outs[:n]) not in returned):
                break
        else:
            return
        raise _Verdict(Status.REJECTED, "output is still correct with the candidate's Triton kernels disabled")

    def _timed(self, child: Child, reply: str, begin: dict[str, Any] | None = None) -> tuple[dict[str, Any], Buffer]:
        """Receive one timed loop; add the parent's own clock reading of it as ``parent_wall_s``. ``begin``: the
        loop's first message, where the caller has read it already."""
        header = begin if begin is not None else child.recv()[0]
        _raise_on_fail(header, "timing_begin")
        t0 = time.perf_counter()
        child.send({"cmd": "go"})
        header, blob = child.recv()
        header["parent_wall_s"] = time.perf_counter() - t0
        _raise_on_fail(header, reply)
        return header, blob

    def _time_command(self, child: Child, cmd: dict[str, Any], gpu: int | None = None) -> tuple[dict, dict, Buffer]:
        """The child times a no-op over the same inputs (the loop's own cost), then the model by the call clock, and
        on a GPU by the device clock too (its samples come back as ``res["device_clock_ms"]``)."""
        child.send(cmd)
        calib, _ = self._timed(child, "calibrated")
        _expect(child, "kept")
        res, blob = self._timed_with_outputs(child, "timed")
        if self.config.device == "cuda":
            dev, dev_blob = self._timed_with_outputs(child, "device")
            _check_reported(dev)
            if cmd.get("check_at"):  # a candidate's (a baseline's keeps none): checked too
                self._check_timed_outputs(dev, dev_blob, cmd["seeds"], gpu, {})
            res.update(device_clock_ms=dev["samples_ms"], device_idle_ms=dev["device_ms"],
                       **{k: _finite(dev.get(k)) for k in ("flush_ms", "queue_ms")})
        return calib, res, blob

    def _timed_with_outputs(self, child: Child, reply: str,
                            begin: dict[str, Any] | None = None) -> tuple[dict[str, Any], Buffer]:
        """One timed loop and the outputs it kept, in one header."""
        res, _ = self._timed(child, reply, begin)
        kept, blob = child.recv()
        _raise_on_fail(kept, "kept")
        outputs = {k: kept[k] for k in ("tensors", "kept", "shared") if k in kept}
        return dict(res, **{"tensors": [], "kept": [], **outputs}), blob

    def _graph(self, child: Child, timing_: Timing, gpu: int | None, details: dict[str, Any]) -> Timing:
        """The call captured in a CUDA graph and its replays timed, as a model served with CUDA graphs runs it. The
        replays' outputs are checked like the timed calls': a graph time counts only where they are right (a call
        that reads device values on the host, say, replays the values of its capture). Never a verdict: a call
        that cannot be captured or replays wrong has no graph time, and the reason says why."""
        seeds = self._timing_seeds(gpu)
        share = 1.0 if self.config.timing.clock == "graph" else self.config.timing.side_share
        check_at = [int.from_bytes(os.urandom(2), "little") / 65536]
        child.send({"cmd": "graph", "seeds": seeds, "reps": max(self.config.timing.min_reps,
                                                                int(timing_.reps * share)), "check_at": check_at})
        header, _ = child.recv()
        if header.get("msg") == "no_graph":
            return replace(timing_, graph_note=f"not captured: {str(header.get('reason', ''))[:300]}")
        try:
            res, blob = self._timed_with_outputs(child, "graph", header)
            _check_reported(res)
            self._check_timed_outputs(res, blob, seeds, gpu, {})
        except _Verdict as v:
            if v.status is Status.REJECTED:  # a cheat is a cheat under replay too
                raise
            return replace(timing_, graph_note=f"failed under graph replay: {v.reason}"[:300])
        graph = Timing.from_samples(res["samples_ms"], res["method"])
        details["graph_reps"] = graph.reps
        return replace(timing_, graph_ms=graph.median_ms).by(self.config.timing.clock)

    def _check_timed_outputs(self, res: dict[str, Any], blob: Buffer, seeds: list[int], gpu: int | None,
                             details: dict[str, Any]) -> None:
        """Outputs of randomly chosen timed repetitions must be right too: work skipped only while timed is caught."""
        # the references of these repetitions are computed after the outputs arrive: leave them room on the device
        memory = res.get("memory") if isinstance(res.get("memory"), dict) else {}
        reserve = _count(memory.get("input_bytes")) + 2 * _count(memory.get("output_bytes"))
        outs = _load_tensors(res, blob, torch.device(self._ref_device(gpu)), reserve)
        n_sets, at = max(1, int(res["input_sets"])), 0
        # the outputs, then the state the forward writes (not the inputs it mutates)
        expected = len(self.problem.output_dtypes) + len(self.problem.mutated_state) if self.problem.output_dtypes \
            else None
        for rep, count in res.get("kept", []):
            if expected is not None and int(count) != expected:
                raise _Verdict(Status.INCORRECT, f"timed repetition {rep}: {int(count)} values returned for checking, "
                                                 f"expected {expected} (the outputs and the state the forward writes)")
            seed = seeds[int(rep) % n_sets]
            ref = self._reference_with_room(seed, 0, gpu)[:int(count)]
            reason = self._compare(ref, outs[at:at + int(count)], self._exact(seed, 0, gpu, int(count)), details)
            at += int(count)
            if reason:
                raise _Verdict(Status.INCORRECT, f"timed repetition {rep}: {reason}")
        if len(res.get("kept", [])) == 0:
            raise _Verdict(Status.REJECTED, "no timed repetition was returned for checking")

    def _time(self, child: Child, details: dict[str, Any], gpu: int | None) -> Timing:
        for attempt in range(WALL_TRIES):
            seeds = self._timing_seeds(gpu)
            check_at = sorted(int.from_bytes(os.urandom(2), "little") / 65536 for _ in range(CHECKED_REPS))
            cmd = {"cmd": "time", "seeds": seeds, "shape": 0, "check_at": check_at}
            self._release_cache(gpu)
            details["timed_at"] = round(time.time(), 3)  # when, by the clock of the day: to set beside a GPU trace
            calib, res, blob = self._time_command(child, cmd, gpu)
            samples, device_ms = res["samples_ms"], res["device_ms"]
            reps, wall = len(samples), res["parent_wall_s"]
            per_rep_s = calib["parent_wall_s"] / max(calib["reps"], 1)
            reported_s = sum(device_ms) / 1e3
            memory = res.get("memory") if isinstance(res.get("memory"), dict) else {}
            _note_peak(details, memory.get("peak_bytes"))
            details.update(reps=reps, input_sets=res["input_sets"], first_call_s=res.get("first_call_s"),
                           host_ms=_finite(res.get("host_ms")), cpu=cpu_of(res),
                           parent_wall_s=wall, reported_s=reported_s, calibrated_s=calib["parent_wall_s"],
                           calibrated_reps=calib["reps"], memory=memory)
            if reported_s > wall * 1.05 + 0.01:  # no stall explains this: never timed again
                raise _Verdict(Status.REJECTED, f"reported {reported_s:.3f} s of runs inside a {wall:.3f} s window")
            allowed = (WALL_SLACK * reported_s + reps * (LOOP_SLACK * per_rep_s
                                                         + SYNC_ALLOWANCE_MS[res["method"]] / 1e3) + WALL_ALLOWANCE_S)
            details["wall_allowed_s"] = allowed
            if wall <= allowed:
                break
            verdict = (f"timed loop took {wall:.3f} s by the parent's clock but the runs report {reported_s:.3f} s "
                       f"({allowed:.3f} s allowed)")
            if attempt + 1 == WALL_TRIES:
                raise _Verdict(Status.REJECTED, f"{verdict}, {WALL_TRIES} times: forged or hidden timing")
            # a loaded machine can stall an honest loop once; forged or hidden timing repeats, and the loop that
            # counts is always one that passed the check
            details["wall_retried"] = verdict
            log.info("%s: timed again", verdict)
        self._check_timed_outputs(res, blob, seeds, gpu, details)
        chosen = samples
        if res["method"] == "cuda-events":
            gap, calib_gap = statistics.median([d - s for s, d in zip(samples, device_ms)]), statistics.median(
                [d - s for s, d in zip(calib["samples_ms"], calib["device_ms"])])
            if gap > calib_gap + max(SIDE_STREAM_MS, SIDE_STREAM_FRAC * statistics.median(samples)):
                details["side_stream"] = f"work outlived the calling stream by {gap:.3f} ms; timed to device idle"
                chosen = device_ms
        return _clocks(chosen, res, "side_stream" in details)

    def _release_cache(self, gpu: int | None) -> None:
        """Hand the memory this process's allocator keeps from computing references back to the device, so that the
        child can plan its input sets on it."""
        if self.config.device == "cuda" and torch.cuda.is_available():
            with torch.cuda.device(self._ref_device(gpu)):
                torch.cuda.empty_cache()

    # --- the head-to-head ----------------------------------------------------------------------------------
    def head_to_head(self, candidate: Candidate, sides: Sequence[str] = BASELINES, gpu: int | None = None,
                     rounds: int = ROUNDS) -> HeadToHead:
        """``candidate`` (verified) and the baselines ``sides`` (headtohead.SIDES) timed in ``rounds`` rounds,
        interleaved, each side in a process of its own prepared alike, on the same input sets, by the configured
        clock; the candidate's outputs of two rounds are checked again. Raises HeadToHeadError where a side cannot
        be timed, or the candidate fails a check (its answer is then the best baseline's)."""
        unknown = [s for s in sides if s not in SIDES]
        if unknown:
            raise ValueError(f"unknown head-to-head sides {unknown}; known: {', '.join(SIDES)}")
        names = [CANDIDATE, *sides]
        medians: dict[str, list[float]] = {n: [] for n in names}
        notes: dict[str, str] = {}
        seeds, checked = self._timing_seeds(gpu), set(random.SystemRandom().sample(range(rounds), min(2, rounds)))
        prepare = {"cmd": "prepare", "seeds": seeds, "round_ms": 2 * self.config.timing.budget_ms / rounds,
                   "graph": self.config.timing.clock == "graph" and self.config.device == "cuda"}
        self._release_cache(gpu)
        try:
            with contextlib.ExitStack() as stack:
                # Every side's process starts, loads and builds at once (none of it timed), but a build that
                # autotunes: its choices come from timings the others' builds would disturb. Then each side, alone,
                # is warmed up and its timing regime chosen.
                children: dict[str, Child] = {}
                for name in names:
                    own = candidate if name == CANDIDATE else None
                    job = self._job("candidate" if own else "baseline", gpu, f"h2h_{name}_{fresh_seed() % 10**6}", own)
                    children[name] = stack.enter_context(Child(job, self.config.timeout_s))
                build = {n: {"cmd": "build", "seeds": seeds, "compile_options": COMPILE_OPTIONS.get(n)} for n in names}
                alone = [n for n in names if (COMPILE_OPTIONS.get(n) or {}).get("max_autotune")]
                together = [n for n in names if n not in alone]
                for name in names:
                    _expect(children[name], "hello")
                    children[name].send({"cmd": "load"})
                for name in names:
                    _expect(children[name], "loaded")
                for name in together:
                    children[name].send(build[name])
                for name in together:
                    _expect(children[name], "built")
                for i, name in enumerate(names):
                    if name in alone:
                        _expect(children[name], "built", send=build[name])
                    # the sides hold their input sets together: each plans on its share of what is free
                    prep = _expect(children[name], "prepared", send=dict(prepare, memory_share=1 / (len(names) - i)))
                    if prep.get("graph_note"):
                        notes[name] = str(prep["graph_note"])[:300]
                for r in range(rounds):
                    for name in names[r % len(names):] + names[:r % len(names)]:  # no side always first
                        check = name == CANDIDATE and r in checked
                        medians[name].append(self._round(children[name], seeds, gpu, check))
                for child in children.values():
                    with contextlib.suppress(ChildDied):
                        child.send({"cmd": "done"})
        except _Verdict as v:
            raise HeadToHeadError(f"{v.status.value}: {v.reason}") from None
        except ChildTimeout:
            raise HeadToHeadError(f"no answer within {self.config.timeout_s:g} s") from None
        except ChildDied as e:
            raise HeadToHeadError(f"a process {e}") from None
        except torch.OutOfMemoryError as e:  # the parent's check of a round's outputs, beside the sides' sets
            raise HeadToHeadError(f"out of memory checking the outputs: {str(e).splitlines()[0][:200]}") from None
        cpu = self.config.device == "cpu"
        return decide(medians, self.config.timing.clock, notes, CPU_MARGIN if cpu else MARGIN,
                      0.0 if cpu else GPU_FLOOR_MS)

    def _round(self, child: Child, seeds: list[int], gpu: int | None, check: bool) -> float:
        """One round of a side's timed calls; its median (to device idle where work outlived the calling stream)."""
        child.send({"cmd": "round", "check_at": [int.from_bytes(os.urandom(2), "little") / 65536] if check else []})
        res, blob = self._timed_with_outputs(child, "round")
        _check_reported(res)
        if check:
            self._check_timed_outputs(res, blob, seeds, gpu, {})
        samples, idle = res["samples_ms"], res["device_ms"]
        if res["method"] == "cuda-events":
            gap = statistics.median([d - s for s, d in zip(samples, idle)])
            if gap > max(SIDE_STREAM_MS, SIDE_STREAM_FRAC * statistics.median(samples)):
                samples = idle
        return statistics.median(samples)

    # --- baseline -------------------------------------------------------------------------------------------
    def baseline(self, gpu: int | None = None, compiled: bool = True) -> Baseline:
        """Time the reference twice, as candidates are timed: eager and under torch.compile (default mode)."""
        timings: dict[str, Timing | None] = {"eager": None, "compiled": None}
        compile_s, error = None, ""
        for key in ("eager", "compiled") if compiled else ("eager",):
            job = self._job("baseline", gpu, f"baseline_{key}_{fresh_seed() % 10**6}")
            try:
                with Child(job, self.config.timeout_s) as child:
                    _expect(child, "hello")
                    _expect(child, "loaded", send={"cmd": "load"})
                    _, res, _ = self._time_command(child, {"cmd": "time", "seeds": self._timing_seeds(gpu),
                                                           "compiled": key == "compiled"})
                    timings[key] = _clocks(res["samples_ms"], res)
                    if self.config.device == "cuda":
                        timings[key] = self._graph(child, timings[key], gpu, {})
                    with contextlib.suppress(ChildDied):  # a child ended by its graph replay's failure
                        child.send({"cmd": "done"})
                if key == "compiled":
                    compile_s = res.get("first_call_s")
            except (_Verdict, ChildTimeout, ChildDied) as e:
                error += f"{key}: {str(e) or type(e).__name__}; "
                log.warning("baseline %s failed: %s", key, e)
        return Baseline(self.config.device, timings["eager"], timings["compiled"], compile_s, error.strip())


def _clocks(samples_ms: list[float], res: dict[str, Any], side_stream: bool = False) -> Timing:
    """The Timing of a timed loop: on a GPU, its call time in a loop of calls (timing.loop_ms: the device clock's
    median where the host keeps ahead of the device, else the synchronized calls' ``samples_ms``), with the host's
    launch time, the device time and the synchronized call's time beside it. Work a call leaves on a side stream
    (``side_stream``) is timed to device idle, never by the device clock."""
    t = Timing.from_samples(samples_ms, res["method"], host_ms=_finite(res.get("host_ms")))
    dev, flush, queue = res.get("device_clock_ms"), res.get("flush_ms"), res.get("queue_ms")
    if not dev or t.host_ms is None:
        return t
    device = statistics.median(dev)
    t = replace(t, device_ms=device, sync_ms=t.median_ms)
    if side_stream or flush is None or queue is None:
        return t
    call = loop_ms(t.median_ms, device, t.host_ms, flush, queue)
    return replace(t, median_ms=call, call_ms=call)


def _check_reported(res: dict[str, Any]) -> None:
    """A timed loop's samples must fit inside the parent's own clock reading of the loop."""
    reported_s, wall = sum(res["samples_ms"]) / 1e3, res["parent_wall_s"]
    if reported_s > wall * 1.05 + 0.01:
        raise _Verdict(Status.REJECTED, f"reported {reported_s:.3f} s of runs inside a {wall:.3f} s window "
                                        f"({res.get('msg')} loop)")


class _PhaseClock:
    """Seconds spent in each phase of an evaluation, for the overhead benchmark and the report."""

    def __init__(self, phases: dict[str, float]):
        self.phases, self.t = phases, time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = round(now - self.t, 4)
        self.t = now


def _request(child: Child, cmd: dict[str, Any], reply: str) -> tuple[dict[str, Any], Buffer]:
    child.send(cmd)
    header, blob = child.recv()
    _raise_on_fail(header, reply)
    return header, blob


def _expect(child: Child, reply: str, send: dict[str, Any] | None = None) -> dict[str, Any]:
    if send is not None:
        child.send(send)
    header, _ = child.recv()
    _raise_on_fail(header, reply)
    return header


def _raise_on_fail(header: dict[str, Any], reply: str) -> None:
    msg = header.get("msg")
    if msg == "fail":
        try:
            status = Status(header.get("status"))
        except ValueError:
            status = Status.RUNTIME_ERROR
        if status is Status.OK:  # only the parent's own checks make a candidate ok
            raise _Verdict(Status.REJECTED, "protocol violation: a failure reported with status 'ok'")
        raise _Verdict(status, str(header.get("reason", ""))[:500], str(header.get("error", ""))[-8000:])
    if msg != reply:
        raise _Verdict(Status.REJECTED, f"protocol violation: expected {reply!r}, got {str(msg)[:40]!r}")


def _note_peak(details: dict[str, Any], peak: Any) -> None:
    """Keep the largest device memory the child reported holding (informational: the child could misreport it)."""
    if isinstance(peak, int):
        details["peak_device_bytes"] = max(details.get("peak_device_bytes", 0), peak)


def _fingerprint(outs: tuple, chunk: int = 1 << 24) -> tuple[int, ...] | None:
    """The bits of ``outs`` in a few integers: each tensor's shape and a position-weighted sum of its elements read
    as integers of their width (equal bits give equal fingerprints; other bits, all but surely not). None for
    anything other than plain tensors of 1, 2, 4 or 8 bytes an element."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    fp: list[int] = []
    for t in outs:
        if type(t) is not torch.Tensor or t.element_size() not in ints:
            return None
        bits = t.detach().contiguous().reshape(-1).view(ints[t.element_size()])
        weights = torch.arange(1, min(chunk, bits.numel()) + 1, device=t.device, dtype=torch.int64)
        total = 0
        for i in range(0, bits.numel(), chunk):
            part = bits[i:i + chunk].to(torch.int64)
            total = total * 1000003 + int((part * weights[:part.numel()]).sum())
        fp += [*t.shape, total]
    return tuple(fp)


def _informative(ref: tuple) -> bool:
    """Whether a reference output takes work to produce: some element of it is non-zero."""
    return any(isinstance(t, torch.Tensor) and bool((t != 0).any()) for t in ref)


def _device_of(tensors: tuple) -> torch.device:
    return next((t.device for t in tensors if isinstance(t, torch.Tensor)), torch.device("cpu"))


def _finite(value: Any) -> float | None:
    """A number the child reported, or None: the channel is the candidate's to write on too."""
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def cpu_of(header: dict[str, Any]) -> dict[str, float]:
    """The CPU's share of a timed loop as the child reported it (timing.cpu_share): its known keys with numbers only."""
    cpu = header.get("cpu")
    if not isinstance(cpu, dict):
        return {}
    return {k: v for k in ("busy_cores", "self_cpu", "preempted") if (v := _finite(cpu.get(k))) is not None}


def _count(value: Any) -> int:
    """A byte count from a child's header; 0 for anything that is not a count (it only places copies)."""
    try:
        return max(0, int(value))
    except (TypeError, ValueError, OverflowError):
        return 0


def _shared_back(child: Child, header: dict[str, Any], outs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Outputs the child shared on the device are copied: its copies go now (it hands their memory back to the
    driver), not with its next command, so that the parent's next reference has that room."""
    if header.get("shared") is not None:
        child.send({"cmd": "release"})
        _raise_on_fail(child.recv()[0], "released")
    return outs


def _load_tensors(header: dict[str, Any], blob: Buffer, device: torch.device = torch.device("cpu"),
                  reserve: int = 0) -> tuple[torch.Tensor, ...]:
    """Tensors from a child's raw bytes, rebuilt from the header's dtypes and shapes: nothing is unpickled, so a
    forged payload cannot run code in the parent. The bytes come in ``blob``, or stay on the device and come by
    handle (``shared``), cloned onto ``device`` with their size checked against the allocation (into host memory
    where they would leave less than ``reserve`` bytes there)."""
    shared = header.get("shared")
    out, offset = [], 0
    try:
        specs = list(header.get("tensors", []))
        if shared is not None and (not isinstance(shared, list) or len(shared) != len(specs)):
            raise ValueError("shared outputs do not match the tensors described")
        for k, spec in enumerate(specs):
            dtype = getattr(torch, str(spec["dtype"]))
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"not a dtype: {spec['dtype']}")
            shape = [int(d) for d in spec["shape"]]
            size = math.prod(shape) * dtype.itemsize
            if shared is not None:
                if int(shared[k]["bytes"]) != size:
                    raise ValueError("shared output size differs from its shape")
                flat = devshare.import_bytes(shared[k], device, reserve)
            else:
                chunk = memoryview(blob)[offset:offset + size]
                if len(chunk) != size:
                    raise ValueError("payload shorter than its header says")
                offset += size
                if not size:
                    flat = torch.empty(0, dtype=torch.uint8)
                else:  # a writable buffer (a blob read from a file) is used in place; a pipe's bytes are copied once
                    flat = torch.frombuffer(bytearray(chunk) if chunk.readonly else chunk, dtype=torch.uint8)
            out.append(flat.view(dtype).reshape(shape))
    except torch.OutOfMemoryError:
        raise  # the parent's own room, not a forged payload
    except (AttributeError, KeyError, TypeError, ValueError, RuntimeError, devshare.DeviceShareError) as e:
        raise _Verdict(Status.REJECTED, f"unreadable output payload: {e}") from e
    if offset != len(blob):
        raise _Verdict(Status.REJECTED, "unreadable output payload: trailing bytes")
    return tuple(out)


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode(errors="replace")
