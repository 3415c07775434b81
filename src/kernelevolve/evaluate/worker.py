"""The evaluation child: one fresh process per candidate, driven command by command by the parent.

The parent sends JSON commands; this process answers each with exactly one JSON header, optionally followed by a blob
of tensors saved with ``torch.save``. stdout and stderr go to a log file and are never read as results. The child
never holds a reference output: it sends its own outputs, and the parent judges them.
"""
from __future__ import annotations

import contextlib
import io
import itertools
import json
import math
import os
import statistics
import sys
import traceback
from dataclasses import replace
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import _disable_current_modes

from kernelevolve.evaluate import checks, devshare, timing
from kernelevolve.problem import (StateSlots, as_outputs, import_module_from_path, input_specs, make_inputs,
                                 same_values, seed_everything)

_no_function_modes = torch._C.DisableTorchFunction
_no_dispatch_modes = _disable_current_modes

CANDIDATE_MODULE = "ke_candidate"
PROBLEM_MODULE = "ke_problem"
# The calibration loop repeats the timed loop's work without the call: as many repetitions, up to this many.
CALIBRATION_REPS = 50
TRIM_BYTES = 1 << 30  # freed device memory handed back after each command from this much on (Session._trim_cache)
CALIBRATION_WARMUP = timing.TimingConfig(budget_ms=0.0, warmup_ms=5.0)
_perf = timing._perf


class Fail(Exception):
    """Ends the evaluation with a status other than ok."""

    def __init__(self, status: str, reason: str, error: str = ""):
        super().__init__(reason)
        self.status, self.reason, self.error = status, reason, error


class Channel:
    """Length-framed messages: a JSON header line, then an optional binary blob. A large blob goes through a file in
    the parent's blob folder instead (one write here, one read there, instead of a pipe's many copies)."""

    FILE_MIN_BYTES = 1 << 20

    def __init__(self, conn: Any, blob_dir: str | None = None):
        self.conn, self.blob_dir, self.seq = conn, blob_dir, 0

    def send(self, header: dict[str, Any], blob: bytes | list[Any] = b"") -> None:
        chunks = blob if isinstance(blob, list) else [blob]
        size = sum(len(memoryview(c).cast("B")) for c in chunks)
        if self.blob_dir and size >= self.FILE_MIN_BYTES:
            self.seq += 1
            name = f"{os.getpid()}-{self.seq}.bin"
            path = os.path.join(self.blob_dir, name)
            try:
                with open(path, "wb") as f:
                    for c in chunks:
                        f.write(c)
            except OSError:  # a full /dev/shm (64 MB in a default Docker container): the pipe still works
                with contextlib.suppress(OSError):
                    os.unlink(path)
            else:
                self.conn.send_bytes(json.dumps(dict(header, blob_file=name, blob_bytes=size)).encode() + b"\n")
                return
        self.conn.send_bytes(json.dumps(header).encode() + b"\n" + b"".join(bytes(c) for c in chunks))

    def recv(self) -> dict[str, Any]:
        return json.loads(self.conn.recv_bytes())


def _release_server_pipe() -> None:
    """Close this child's copy of the write end of the fork server's "alive" pipe (every process the server forks
    gets one). The server exits when no copy is left open, and only then: with every child's closed, it exits when
    its owner, the evaluating process, dies, and the children die with it (checks.die_with_parent)."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if isinstance(fd, int):
        with contextlib.suppress(OSError):
            os.close(fd)
        server._forkserver_alive_fd = None


def child_main(conn: Any, job: dict[str, Any]) -> None:
    """Entry point of the child process (forked from the fork server, so torch is already imported)."""
    try:
        os.setsid()  # own process group: the parent kills the whole group on timeout
    except OSError:
        pass
    if job.get("nice"):  # background work (the screen's checks): the processes that time kernels get the cores first
        with contextlib.suppress(OSError, AttributeError, ValueError):
            os.nice(int(job["nice"]))
    timing.prepare_process()
    checks.become_subreaper()
    checks.die_with_parent(job.get("server_pid"))
    _release_server_pipe()
    _redirect_output(job["log"])
    clean = checks.scrub_environment(dict(os.environ))
    os.environ.clear()
    os.environ.update(clean)
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # no compile worker pool outliving a call
    if job.get("gpu") is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible_device(job["gpu"], os.environ.get("CUDA_VISIBLE_DEVICES"))
    if job["device"] == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    chan = Channel(conn, job.get("blob_dir"))
    try:
        Session(job, chan).serve()
    except Fail as f:
        _send_quietly(chan, {"msg": "fail", "status": f.status, "reason": f.reason, "error": f.error})
    except BaseException as e:  # the harness's own failure, or SystemExit raised by the candidate
        _send_quietly(chan, {"msg": "fail", "status": "runtime_error", "reason": _one_line(e),
                             "error": traceback.format_exc()})
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        checks.kill_children()
        os._exit(0)  # skip atexit handlers a candidate may have registered


def visible_device(gpu: int, inherited: str | None) -> str:
    """The CUDA_VISIBLE_DEVICES entry for the parent's device index ``gpu``: the parent counts its devices within the
    CUDA_VISIBLE_DEVICES it was started with (here inherited), not among all of the machine's."""
    visible = [d.strip() for d in inherited.split(",")] if inherited else []
    return visible[gpu] if 0 <= gpu < len(visible) else str(gpu)


def _send_quietly(chan: Channel, header: dict[str, Any]) -> None:
    try:
        chan.send(header)
    except (OSError, ValueError):
        pass


def _redirect_output(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), line_buffering=True)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    head = text[0] if text else ""
    if type(e).__name__ == "CompilationError":
        # Triton's message opens with "at line:col:" and the kernel's source; what went wrong comes last, or as cause
        detail = getattr(e, "error_message", None) or (repr(e.__cause__) if e.__cause__ is not None else "")
        head = f"{head} {(str(detail).strip().splitlines() or [''])[0]}".strip()
    return f"{type(e).__name__}: {head}"[:300]


def classify(e: BaseException) -> str:
    """Map an exception raised while running a candidate to a status."""
    names = " ".join(f"{c.__module__}.{c.__name__}" for c in type(e).__mro__)
    if "CompilationError" in names or "BackendCompilerFailed" in names or "triton.compiler" in names:
        return "compile_error"
    # The Triton interpreter (CPU) runs a kernel body as Python and wraps its errors in InterpreterError. Unknown
    # names, bad types and incompatible shapes are what the GPU compiler reports as CompilationError.
    cause = e
    while type(cause).__name__ == "InterpreterError" and cause.__cause__ is not None:
        cause = cause.__cause__
    if cause is not e and isinstance(cause, (NameError, AttributeError, TypeError, ValueError)):
        return "compile_error"
    return "runtime_error"


# nn.init's random fills: a quick build skips them, filling a floating tensor with NaN instead (a fill costs a tenth
# of a random draw): whatever __init__ derives from such a value comes out NaN and fails the check, so a quick build
# passes or fails the same way every time, never by what the allocator's reused memory happened to hold
_RANDOM_INITS = ("uniform_", "normal_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
                 "xavier_normal_", "orthogonal_", "sparse_")


@contextlib.contextmanager
def _no_random_init() -> Iterator[list[int]]:
    """nn.init's random fills as NaN fills for the block; yields a one-item list counting the fills skipped (none: the
    build was a full one)."""
    saved = {name: getattr(torch.nn.init, name) for name in _RANDOM_INITS if hasattr(torch.nn.init, name)}
    skipped = [0]

    def nan_fill(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        skipped[0] += 1
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
            with torch.no_grad():
                tensor.fill_(float("nan"))
        return tensor

    try:
        for name in saved:
            setattr(torch.nn.init, name, nan_fill)
        yield skipped
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


def _all_state_in(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> bool:
    """Whether loading ``state`` sets every tensor ``model`` holds: the same state_dict entries, no non-persistent
    buffer, and no tensor kept as a plain attribute (or in a list, tuple or dict of them), which __init__ may have
    derived from the values a quick build left unset."""
    if set(model.state_dict()) != set(state):
        return False
    registered = {id(t) for t in itertools.chain(model.parameters(), model.buffers())}  # e.g. an RNN's _flat_weights
    for module in model.modules():
        if getattr(module, "_non_persistent_buffers_set", None):
            return False
        for name, value in vars(module).items():
            if name in ("_parameters", "_buffers", "_modules"):
                continue
            if isinstance(value, dict):
                values = value.values()
            elif isinstance(value, (list, tuple)):
                values = value
            else:
                values = (value,)
            if any(isinstance(v, torch.Tensor) and id(v) not in registered for v in values):
                return False
    return True


class Session:
    """Holds the loaded model and answers the parent's commands."""

    def __init__(self, job: dict[str, Any], chan: Channel):
        self.job, self.chan = job, chan
        self.device = job["device"]
        self.cfg = timing.TimingConfig(**job.get("timing", {}))
        torch.backends.cuda.matmul.allow_tf32 = bool(job.get("allow_tf32"))
        torch.backends.cudnn.allow_tf32 = bool(job.get("allow_tf32"))
        self.timers = checks.timer_snapshot()
        self.threads = checks.live_threads()
        self.origins = checks.ThreadOrigins(job.get("candidate", ""))
        self.procs = checks.child_processes()
        self.model: Any = None
        self.fn: Any = None  # what cmd_time timed last (the model, or the baseline's torch.compile of it)
        self.rounds: Any = None  # cmd_prepare's: the function, input sets, live buffers, memory plan, repetitions
        self.state: StateSlots | None = None  # the state the reference's forward writes, with its loaded values
        self._saved_state: dict[str, torch.Tensor] | None = None
        self.quick = False  # the screen's last candidate was built without its random initialisation
        self.problem: Any = None
        self.kernels: list[str] = []
        self.launches = 0
        self.ghost = False
        self.inputs: list[Any] | None = None
        self.first_call_s: float | None = None
        self.out_specs: list[tuple[tuple[int, ...], torch.dtype]] | None = None
        self.call_bytes = 0  # the most device memory a call allocated beyond what it was given
        self.peak_seen = 0
        self.exporter = devshare.Exporter()
        self.backends = _backend_flags()  # as the harness set them: a screen batch's candidates each start so
        self._hook_triton()

    def serve(self) -> None:
        self.chan.send({"msg": "hello", "pid": os.getpid()})
        while True:
            cmd = self.chan.recv()
            self.exporter.release()  # the parent is done with the outputs it was last sent
            if cmd["cmd"] == "done":
                return
            getattr(self, f"cmd_{cmd['cmd']}")(cmd)
            if cmd["cmd"] in ("trial", "recall", "ghost"):  # not after timing: the next round starts warm
                self._trim_cache()

    def _trim_cache(self) -> None:
        """Hand the device memory this process freed (a call's temporaries, the mutation check's copy, the last
        outputs) back to the driver once a command is over, where it is a gigabyte or more: the parent computes the
        next reference in that room, and the output share allocates outside torch's cache. Otherwise, with inputs
        and outputs of 16 GB, the parent's references fell back to the host, and so did the comparisons."""
        if self.device == "cuda" and torch.cuda.memory_reserved() - torch.cuda.memory_allocated() >= TRIM_BYTES:
            torch.cuda.empty_cache()

    # --- commands -------------------------------------------------------------------------------------------
    def cmd_load(self, cmd: dict[str, Any]) -> None:
        t0 = _perf()
        self.problem = import_module_from_path(self.job["problem"], PROBLEM_MODULE)
        if self.job["mode"] == "screen":  # the candidates come one command at a time
            self.chan.send({"msg": "loaded", "load_s": _perf() - t0, "kernels": [], "weights": None})
            return
        if self.job["mode"] == "baseline":
            self.model = self._build(self.problem, "Model").to(self.device)
            self.compiled = None
        else:
            self.model, weights = self._load_candidate()
        self._keep_initial_state()
        self._check_tamper("import")
        self.chan.send({"msg": "loaded", "load_s": _perf() - t0, "kernels": self.kernels,
                        "weights": "reference" if self.job["mode"] == "baseline" else weights})

    def cmd_release(self, cmd: dict[str, Any]) -> None:
        """The parent has copied the outputs shared with it (the loop released them on this command's arrival)."""
        self._trim_cache()
        self.chan.send({"msg": "released"})

    def cmd_trial(self, cmd: dict[str, Any]) -> None:
        self.inputs = None  # the last trial's: their memory goes to this one's
        self.inputs = make_inputs(self.problem, cmd["seed"], cmd.get("shape", 0), self.device)
        self._send_outputs(self._call(self.inputs))

    def cmd_recall(self, cmd: dict[str, Any]) -> None:
        """New values in the same input buffers: an output cached by pointer, id or first call goes stale."""
        fresh = make_inputs(self.problem, cmd["seed"], cmd.get("shape", 0), self.device)
        assert self.inputs is not None, "recall before trial"
        for i, (old, new) in enumerate(zip(self.inputs, fresh)):
            if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)):
                self.inputs[i] = new  # a plain value (a maximum length, say) takes the new draw's
            elif old.shape == new.shape:
                old.copy_(new)
            else:  # a size that depends on the draw (a jagged total) that the parent could not match: the same
                with torch.no_grad():  # tensor, resized in place (a smaller size keeps its pointer), new values
                    try:
                        old.resize_(new.shape).copy_(new)
                    except RuntimeError:  # not resizable (a view of another tensor's storage)
                        old.set_(new)
        self._send_outputs(self._call(self.inputs))

    def cmd_ghost(self, cmd: dict[str, Any]) -> None:
        """Run with the candidate's own Triton kernels disabled: the output must then be wrong."""
        inputs = make_inputs(self.problem, cmd["seed"], cmd.get("shape", 0), self.device)
        self.ghost = True
        try:
            self._reset_state()
            with torch.no_grad():
                out = self.model(*inputs)
            self._sync()
            outs = self._with_inputs(as_outputs(out) + self._state_after(), inputs)
        except Exception as e:  # a crash with kernels disabled is a pass for the candidate
            self.chan.send({"msg": "output", "ghost_error": _one_line(e)})
            return
        finally:
            self.ghost = False
        self._send_outputs(outs, check_types=False)

    def cmd_time(self, cmd: dict[str, Any]) -> None:
        shape = cmd.get("shape", 0)
        self.inputs = None  # the last trial's inputs: their memory goes to the input sets
        compiled = bool(cmd.get("compiled"))
        fn = self.fn = torch.compile(self.model) if compiled else self.model
        if compiled or self.out_specs is None:  # a baseline has run no trial: one call tells the outputs' sizes
            t0 = _perf()
            self._reset_state()
            with torch.no_grad():
                self._learn_outputs(fn(*make_inputs(self.problem, cmd["seeds"][0], shape, self.device)))
            self._sync()
            if compiled:
                self.first_call_s = _perf() - t0
        plan = self._memory_plan(cmd["seeds"], shape)
        sets = self._input_sets(cmd["seeds"], shape, plan["input_sets"])
        check_at = cmd.get("check_at", [])
        with torch.no_grad():
            calls, reps = timing.warm_up(fn, sets, self.device, self.cfg, self._before())
            # First the same loop over the same inputs with a stand-in that returns harness-made tensors shaped like
            # the outputs: every cost of the loop but the call itself (refills, flushes, syncs, the copies of the
            # checked repetitions), as many repetitions (up to CALIBRATION_REPS) with as many checked. It is the
            # parent's measure of what the timed loop may cost beyond the times it reports.
            stand_in = _returning(tuple(torch.empty(shape_, dtype=dtype, device=self.device)
                                        for shape_, dtype in self.out_specs))
            warm, _ = timing.warm_up(stand_in, sets, self.device, CALIBRATION_WARMUP, self._before())
            self._timed(stand_in, sets, "calibrated", warm, min(reps, CALIBRATION_REPS), check_at, plan)
            del stand_in  # and its outputs' memory
            host_ms = self._timed(fn, sets, "timed", calls, reps, check_at, plan)
            if self.device == "cuda":  # the device clock: the same call, launched while the device is kept busy
                self._timed(fn, sets, "device", calls, max(self.cfg.min_reps, int(reps * self.cfg.side_share)),
                            check_at[:1], plan, ahead_ms=timing.ahead_for(host_ms), note=self._flush_costs())
        self._check_tamper("timing")

    def cmd_graph(self, cmd: dict[str, Any]) -> None:
        """The last timed function (cmd_time's) captured in a CUDA graph and its replays timed, by the call clock; the
        outputs of the replays at ``check_at`` go back to be checked. A call that cannot be captured is answered
        with the reason, which is no fault of the candidate's."""
        plan, sets, live = self._live_sets(cmd["seeds"])
        with torch.no_grad():
            try:
                replay = timing.capture_graph(self.fn, live)
            except timing.GraphError as e:
                self._check_tamper("graph capture")
                self.chan.send({"msg": "no_graph", "reason": str(e)})
                return
            calls, _ = timing.warm_up(replay, sets, self.device, CALIBRATION_WARMUP, self._before())
            self._timed(replay, sets, "graph", calls, int(cmd["reps"]), cmd.get("check_at", []), plan, live=live)
        del replay, live
        self._check_tamper("graph replay")

    # --- the head-to-head: rounds of timed calls, which the parent interleaves with other processes' --------------
    def cmd_build(self, cmd: dict[str, Any]) -> None:
        """The function the rounds time, built and called once on the first input set: the model, or torch.compile
        of it with ``compile_options`` (a baseline's). Nothing here is timed, so the parent builds every side's at
        once (a compile's autotuning, which times kernels, excepted)."""
        options = cmd.get("compile_options")
        self.fn = self.model if options is None else torch.compile(self.model, options=options or None)
        self._reset_state()
        with torch.no_grad():
            self._learn_outputs(self.fn(*make_inputs(self.problem, cmd["seeds"][0], 0, self.device)))
        self._sync()
        self.chan.send({"msg": "built"})

    def cmd_prepare(self, cmd: dict[str, Any]) -> None:
        """Ready the built function (cmd_build) to time in rounds (cmd_round) on the parent's input sets: warmed up,
        and with ``graph``, captured in a CUDA graph (or, where it cannot be, called as it is, with the reason in
        ``graph_note``). ``round_ms`` sizes a round's repetitions; ``memory_share`` is the share of the free memory
        its input sets may take (_memory_plan)."""
        seeds = cmd["seeds"]
        plan, sets, live = self._live_sets(seeds, float(cmd.get("memory_share", 1.0)))
        fn, note = self.fn, ""
        with torch.no_grad():
            if cmd.get("graph") and self.device == "cuda":
                try:
                    fn = timing.capture_graph(self.fn, live)
                except timing.GraphError as e:
                    note = f"not captured, called as it is: {e}"
            _, reps = timing.warm_up(fn, sets, self.device, replace(self.cfg, budget_ms=float(cmd["round_ms"])),
                                     self._before())
            ahead_ms = self._ahead_ms(fn, sets, plan, live) if self.device == "cuda" and fn is self.fn else 0.0
        self.rounds = (fn, sets, live, plan, reps, ahead_ms)
        self._check_tamper("warm-up")
        self.chan.send({"msg": "prepared", "reps": reps, "graph_note": note, "ahead_ms": ahead_ms})

    def _live_sets(self, seeds: list[int], share: float = 1.0) -> tuple[dict[str, Any], list[list[Any]],
                                                                       timing.LiveInputs]:
        """The memory plan (on ``share`` of the free memory), the input sets of ``seeds`` (shape 0) and the one set
        of live buffers they refill, kept for the loops that must time the same buffers (a CUDA graph is captured
        on them)."""
        plan = self._memory_plan(seeds, 0, share)
        sets = self._input_sets(seeds, 0, plan["input_sets"])
        return plan, sets, timing.LiveInputs(sets, plan["in_place"], self._before())

    def _ahead_ms(self, fn: Any, sets: list[list[Any]], plan: dict[str, Any], live: timing.LiveInputs) -> float:
        """How the rounds time this side, by timing.host_keeps_ahead: where its host launches a call faster than the
        device runs it, a sleep queued ahead of each call (the device clock), else none."""
        probe = min(self.cfg.max_reps, 20)
        sync = timing.measure(fn, sets, self.device, probe, self.cfg, in_place=plan["in_place"], before=self._before(),
                              live=live)
        host = _median(sync.host_ms) or 0.0
        ahead = timing.ahead_for(host)
        dev = timing.measure(fn, sets, self.device, probe, self.cfg, in_place=plan["in_place"], before=self._before(),
                             ahead_ms=ahead, live=live)
        costs = self._flush_costs()
        ahead_of_device = timing.host_keeps_ahead(statistics.median(dev.samples_ms), host, costs["flush_ms"],
                                                  costs["queue_ms"])
        return ahead if ahead_of_device else 0.0

    def cmd_round(self, cmd: dict[str, Any]) -> None:
        """One round of timed calls. Each round but a graph's refills new buffers behind an allocation of a random
        size: where the buffers lie changes a call's time by a few percent (cache sets, page boundaries; +-5% for
        one elementwise op on a CPU), and a layout kept for the whole head-to-head would give one side that offset
        in every round, which no number of rounds averages out."""
        fn, sets, live, plan, reps, ahead_ms = self.rounds
        pad = None
        if fn is self.fn and not plan["in_place"]:
            pad = torch.empty(int.from_bytes(os.urandom(3), "little") // 4, dtype=torch.int32, device=self.device)
            live = timing.LiveInputs(sets, False, self._before())
        with torch.no_grad():
            self._timed(fn, sets, "round", 0, reps, cmd.get("check_at", []), plan, ahead_ms=ahead_ms, live=live)
        del pad, live
        self._check_tamper("a round")

    # --- the screen: many candidates in one process, each checked once and timed briefly ----------------------
    def cmd_screen_check(self, cmd: dict[str, Any]) -> None:
        """Load one candidate of a screen batch and call it once; the parent compares its outputs. A failure is
        answered, not fatal: the parent decides whether the process is still fit for the next candidate."""
        try:
            self._screen_load(cmd["candidate"], bool(cmd.get("quick")))
            self.inputs = make_inputs(self.problem, cmd["seed"], 0, self.device)
            self._send_outputs(self._call(self.inputs), quick=self.quick)
        except Fail as f:
            self.chan.send({"msg": "fail", "status": f.status, "reason": f.reason, "error": f.error,
                            "quick": self.quick})
        finally:
            self.inputs = None

    def cmd_screen_time(self, cmd: dict[str, Any]) -> None:
        """Load one candidate already checked and time it briefly, the cache flushed before every repetition."""
        try:
            self._screen_load(cmd["candidate"], bool(cmd.get("quick")))
            seeds, cfg = cmd["seeds"], timing.TimingConfig(**self.job["screen_timing"])
            inputs = make_inputs(self.problem, seeds[0], 0, self.device)
            if self.device == "cuda":  # the call's own temporaries, for the memory plan
                torch.cuda.reset_peak_memory_stats()
                held = torch.cuda.memory_allocated()
            with torch.no_grad():
                self._learn_outputs(self.model(*inputs))
            self._sync()
            if self.device == "cuda":
                self.call_bytes = max(0, torch.cuda.max_memory_allocated() - held)
            del inputs
            plan = self._memory_plan(seeds, 0)
            sets = self._input_sets(seeds, 0, plan["input_sets"])
            with torch.no_grad():
                calls, reps = timing.warm_up(self.model, sets, self.device, cfg, self._before())
                run = timing.measure(self.model, sets, self.device, reps, cfg, calls, in_place=plan["in_place"],
                                     before=self._before())
            del sets
            self._check_tamper("timing")
            self.chan.send({"msg": "screen_timed", "samples_ms": run.samples_ms, "method": run.method,
                            "reps": reps, "host_ms": _median(run.host_ms), "cpu": run.cpu, "quick": self.quick})
        except Fail as f:
            self.chan.send({"msg": "fail", "status": f.status, "reason": f.reason, "error": f.error})
        except Exception as e:
            self.chan.send({"msg": "fail", "status": classify(e), "reason": _one_line(e),
                            "error": traceback.format_exc()})

    def cmd_screen_rest(self, cmd: dict[str, Any]) -> None:
        """Between batches: drop the last candidate and hand its memory back, then wait for the next batch."""
        self.model, self.inputs, self.out_specs = None, None, None
        if self.device == "cuda":
            torch.cuda.empty_cache()
        self.chan.send({"msg": "rested"})

    def _screen_load(self, path: str, quick: bool = False) -> None:
        """The next candidate of a batch, in a process whose earlier candidates all passed: anything they left
        behind (replaced timers, threads, processes) makes this process unfit, which is no fault of this one."""
        self.model = None
        if self.device == "cuda":
            torch.cuda.empty_cache()
        try:
            self._check_tamper("an earlier candidate of the batch")
        except Fail as f:
            raise Fail("unfit", f.reason) from None
        _restore_backends(self.backends)
        self.job = dict(self.job, candidate=path)
        self.origins.candidate_file = os.path.realpath(path)
        self.kernels, self.first_call_s, self.out_specs, self.call_bytes = [], None, None, 0
        self.quick = False
        self.model, weights = self._load_candidate(quick)
        self.quick = weights == "quick"
        self._keep_initial_state()

    # --- helpers --------------------------------------------------------------------------------------------
    def _flush_costs(self) -> dict[str, float]:
        flush = torch.empty(timing.FLUSH_BYTES["cuda"], dtype=torch.int8, device=self.device)
        flush_ms, queue_ms = timing.flush_costs(flush)
        return {"flush_ms": flush_ms, "queue_ms": queue_ms}

    def _timed(self, fn: Any, sets: list[list[Any]], reply: str, calls: int, reps: int, check_at: list[float],
               plan: dict[str, Any], ahead_ms: float = 0.0, live: timing.LiveInputs | None = None,
               note: dict[str, Any] | None = None) -> float | None:
        """One timed loop, driven by the parent's word; returns the median host time of a call (ms). ``note`` goes
        into the loop's header."""
        keep = sorted({min(reps - 1, int(f * reps)) for f in check_at})
        self.chan.send({"msg": "timing_begin", "reps": reps})
        # The loop starts only on the parent's word, so that the parent's clock of it starts first, whatever the
        # parent was still reading.
        if self.chan.recv().get("cmd") != "go":
            raise Fail("runtime_error", "protocol: expected the parent's go before a timed loop")
        run = timing.measure(fn, sets, self.device, reps, self.cfg, calls, keep, plan["keep_on_host"],
                             plan["in_place"], self._before(), self.state.read if self.state is not None else None,
                             ahead_ms=ahead_ms, live=live)
        host_ms = _median(run.host_ms)
        self.chan.send({**(note or {}), "msg": reply, "samples_ms": run.samples_ms, "device_ms": run.device_ms,
                        "host_ms": host_ms, "cpu": run.cpu,
                        "loop_wall_s": run.loop_wall_s, "reps": reps, "warmup_calls": calls, "method": run.method,
                        "input_sets": len(sets), "first_call_s": self.first_call_s,
                        "memory": dict(plan, peak_bytes=self._peak_bytes())})
        # The checked outputs are encoded and sent only after the header, out of the parent's reading of the loop:
        # moving them to the host takes seconds for outputs of gigabytes.
        kept = [run.kept[i] for i in keep]
        del run
        if reply == "calibrated":  # the stand-in's outputs: copied like the real ones in the loop, never checked
            kept = [()] * len(keep)
        with _harness_only():
            header, blob = self._pack([o for outs in kept for o in outs])
        self.chan.send(dict(header, msg="kept", kept=[[i, len(outs)] for i, outs in zip(keep, kept)]), blob)
        return host_ms

    def _learn_outputs(self, out: Any) -> None:
        """The shapes and dtypes of what a call returns (not the inputs that a mutating op also hands back)."""
        self.out_specs = [(tuple(o.shape), o.dtype) for o in as_outputs(out) if isinstance(o, torch.Tensor)]

    def _free_bytes(self) -> int:
        if self.device == "cuda":  # free on the device, and what this process's allocator holds unused
            return int(torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved() - torch.cuda.memory_allocated())
        try:
            return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            return 4 << 30

    def _peak_bytes(self) -> int | None:
        """The most device memory this process has held so far (the allocator's peak, kept across its resets)."""
        if self.device != "cuda":
            return None
        self.peak_seen = max(self.peak_seen, int(torch.cuda.max_memory_reserved()))
        return self.peak_seen

    def _memory_plan(self, seeds: list[int], shape: int, share: float = 1.0) -> dict[str, Any]:
        """How many input sets to rotate through and where to keep the checked outputs, from what they cost against
        ``share`` of the memory that is free now (the rest left to processes that plan after this one and hold
        their sets beside it: a head-to-head's sides): the timed loop needs the live buffers, two outputs at a time
        (the last and the next), the call's own temporaries (its peak in the trials), the flush buffer and the
        checked copies."""
        specs = input_specs(self.problem, seeds[0], shape, self.device)
        in_bytes = max(1, _spec_bytes(filter(None, specs)))
        out_bytes = _spec_bytes(self.out_specs or [])
        flush = timing.FLUSH_BYTES["cuda" if self.device == "cuda" else "cpu"]
        # the parent computes references and compares on the same device while the child holds its sets: leave it
        # one input set and a few outputs' worth
        parent = in_bytes + 3 * out_bytes if self.device == "cuda" else 0
        spare = share * (0.85 * self._free_bytes() - parent) - flush - 2 * out_bytes - self.call_bytes
        kept = min(len(seeds), 2) * out_bytes
        keep_on_host = spare - kept < 2 * in_bytes
        if not keep_on_host:
            spare -= kept
        # the sets, plus the live buffers they refill (the sets themselves when only one fits and the op leaves its
        # inputs alone)
        n = max(1, min(len(seeds), int(spare // in_bytes) - 1))
        in_place = n == 1 and not self.job.get("mutates_inputs") and spare < 2 * in_bytes
        return {"input_sets": n, "keep_on_host": bool(keep_on_host), "in_place": bool(in_place),
                "input_bytes": in_bytes, "output_bytes": out_bytes, "call_bytes": self.call_bytes}

    def _input_sets(self, seeds: list[int], shape: int, n: int) -> list[list[Any]]:
        """The input sets timing rotates through: they refill one set of buffers, so a draw whose sizes differ from
        the first's (a jagged total the parent could not match) is left out."""
        sets = [make_inputs(self.problem, s, shape, self.device) for s in seeds[:max(1, n)]]

        def shapes(xs: list[Any]) -> list[Any]:
            return [tuple(x.shape) if isinstance(x, torch.Tensor) else None for x in xs]

        # the leading sets only: the parent checks repetition r against the set seeds[r % len(sets)]
        first = shapes(sets[0])
        return list(itertools.takewhile(lambda xs: shapes(xs) == first, sets))

    def _build(self, module: Any, cls_name: str) -> torch.nn.Module:
        seed_everything(self.job["init_seed"])
        return getattr(module, cls_name)(*self.problem.get_init_inputs())

    def _load_candidate(self, quick: bool = False) -> tuple[torch.nn.Module, str]:
        """The candidate's ModelNew, built from the problem's init inputs under the reference's seed and given the
        reference's weights where its state_dict has the same entries. ``quick`` (the screen's only) builds it first
        without nn.init's random fills, which take seconds for a large table on the CPU, and keeps that build where
        every tensor the model holds is one the weights replace; else it builds it in full. The judge always builds
        in full."""
        try:
            cand = import_module_from_path(self.job["candidate"], CANDIDATE_MODULE)
        except SyntaxError as e:
            raise Fail("compile_error", f"syntax error at line {e.lineno}: {e.msg}", traceback.format_exc())
        except Exception as e:
            raise Fail("compile_error", f"import failed: {_one_line(e)}", traceback.format_exc())
        self._check_tamper("import")
        if not isinstance(getattr(cand, "ModelNew", None), type):
            raise Fail("compile_error", "the candidate defines no class ModelNew")
        self.kernels = [n for n, v in vars(cand).items() if _is_triton_kernel(v)]
        if os.environ.get("TRITON_INTERPRET") == "1":
            _first_configs(cand)
        try:
            state = self._reference_weights()
            model = None
            if quick:
                try:
                    with _no_random_init() as skipped:
                        model = self._build(cand, "ModelNew")
                except Exception:  # perhaps on values the skipped fills left unset: the full build decides
                    model = None
                if model is not None and skipped[0]:  # with no fill skipped it was a full build
                    if _all_state_in(model, state):
                        model.load_state_dict(state)
                        return model.to(self.device), "quick"
                    model = None  # its memory back before the full build
            if model is None:
                model = self._build(cand, "ModelNew")
            weights = "seed"
            if set(model.state_dict()) == set(state):
                model.load_state_dict(state)
                weights = "state_dict"
            return model.to(self.device), weights
        except Exception as e:
            raise Fail("runtime_error", f"ModelNew construction failed: {_one_line(e)}", traceback.format_exc())

    def _keep_initial_state(self) -> None:
        """The model's buffers and parameters the reference's forward writes, as loaded: every judged and every timed
        call starts from them (put back outside the timed window), and what a judged call leaves in them is judged
        beside the outputs."""
        names = self.job.get("mutated_state") or []
        self.state = None
        if not names:
            return
        try:
            with _harness_only():
                self.state = StateSlots(self.model, names)
        except KeyError as e:
            raise Fail("incorrect", f"the model has no buffer or parameter {e.args[0]!r}, which the reference's "
                                    "forward updates") from None
        # the initial values are the reference's where its saved state has them, not whatever the model was left
        # holding after its construction and .to()
        saved = self._reference_state()
        with _harness_only():
            for k, name in enumerate(names):
                ref, mine = saved.get(name), self.state.initial[k]
                if ref is None:
                    continue
                if (ref.shape, ref.dtype) != (mine.shape, mine.dtype):
                    raise Fail("incorrect", f"{name!r} is {tuple(mine.shape)} {mine.dtype}, the reference's "
                                            f"{tuple(ref.shape)} {ref.dtype}")
                self.state.initial[k] = ref.to(mine.device, copy=True)

    def _reset_state(self) -> None:
        if self.state is not None:
            with _harness_only():
                self.state.reset()

    def _state_after(self) -> tuple[Any, ...]:
        if self.state is None:
            return ()
        with _harness_only():
            return self.state.values()

    def _reference_state(self) -> dict[str, torch.Tensor]:
        """The reference's initial values of the state its forward writes, from the state_dict the parent saved; read
        once per process (a screen loads many candidates), and only those entries kept."""
        if self._saved_state is None:
            names = set(self.job.get("mutated_state") or [])
            self._saved_state = {n: t for n, t in self._reference_weights().items() if n in names}
        return self._saved_state

    def _reference_weights(self) -> dict[str, torch.Tensor]:
        """The state_dict the parent saved, mapped from its file rather than read: a screen process loads many
        candidates, and reading a table of a million rows takes a second each time, mapping it a few milliseconds
        (the processes share its pages). A fresh mapping per load, so that nothing a candidate's load hooks do to
        these tensors reaches the next candidate; loading copies from them."""
        try:
            return torch.load(self.job["state_dict"], weights_only=True, mmap=True)
        except RuntimeError:  # a file in the legacy format cannot be mapped
            return torch.load(self.job["state_dict"], weights_only=True)

    def _before(self) -> Any:
        """What the timing loops run before each call, outside the timed window: the model's state put back."""
        return self._reset_state if self.state is not None else None

    def _call(self, inputs: list[Any]) -> tuple[Any, ...]:
        before = self._copies(inputs)
        self._reset_state()
        cuda = self.device == "cuda"
        if cuda:
            self._peak_bytes()  # before the reset, which clears the peak so far
            torch.cuda.reset_peak_memory_stats()
            held = torch.cuda.memory_allocated()
        t0 = _perf()
        try:
            with torch.no_grad():
                out = self.model(*inputs)
            self._sync()
        except Exception as e:
            raise Fail(classify(e), _one_line(e), traceback.format_exc())
        if cuda:
            self.call_bytes = max(self.call_bytes, torch.cuda.max_memory_allocated() - held)
        self._learn_outputs(out)
        if self.first_call_s is None:
            self.first_call_s = _perf() - t0
        self._check_tamper("call")
        with _harness_only():
            if not self.job.get("mutates_inputs"):
                for i, (b, v) in enumerate(zip(before, inputs)):
                    if b is not None and not same_values(b, v):
                        raise Fail("rejected", f"forward modified input {i} (the reference does not)")
        return self._with_inputs(as_outputs(out) + self._state_after(), inputs)

    def _copies(self, inputs: list[Any]) -> list[torch.Tensor | None]:
        """The inputs as they were before a call, for the check that it leaves them alone: on the device, or in host
        memory where a device copy would leave less room than the inputs take for what the call allocates (inputs
        of 16 GB on an 80 GB card whose other processes hold the references)."""
        tensors = [v for v in inputs if isinstance(v, torch.Tensor)]
        size = sum(v.numel() * v.element_size() for v in tensors)
        host = self.device == "cuda" and 2 * size > self._free_bytes()
        with _harness_only():
            return [(v.to("cpu", copy=True) if host and v.is_cuda else v.clone()) if isinstance(v, torch.Tensor)
                    else None for v in inputs]

    def _with_inputs(self, outs: tuple[Any, ...], inputs: list[Any]) -> tuple[Any, ...]:
        """When the reference mutates its inputs, the inputs after the call are part of the result and are judged."""
        if not self.job.get("mutates_inputs"):
            return outs
        return outs + tuple(v for v in inputs if isinstance(v, torch.Tensor))

    def _send_outputs(self, outs: tuple[Any, ...], check_types: bool = True, **extra: Any) -> None:
        if check_types:
            for i, o in enumerate(outs):
                if isinstance(o, torch.Tensor) and type(o) is not torch.Tensor:
                    raise Fail("rejected", f"output {i} is a {type(o).__name__}, a torch.Tensor subclass")
                if not isinstance(o, torch.Tensor):
                    raise Fail("incorrect", f"output {i} is {type(o).__name__}, not a torch.Tensor")
                if o.device.type != torch.device(self.device).type:
                    raise Fail("incorrect", f"output {i} is on {o.device}, expected {self.device}")
        with _harness_only():
            header, blob = self._pack(list(outs))
        self.chan.send(dict(header, msg="output", launches=self.launches, first_call_s=self.first_call_s,
                            peak_bytes=self._peak_bytes(), **extra), blob)

    def _pack(self, outs: list[Any]) -> tuple[dict[str, Any], Any]:
        """The outputs as a header and a blob of their bytes; large outputs on the GPU stay on the device, sent by
        handle (devshare), unless the driver refuses, when they take the host path."""
        meta, tensors = _describe(outs)
        min_bytes = self.job.get("share_min_bytes")
        # only outputs on the device: the copies kept in host memory go by the host path, not back to the device
        if (self.device == "cuda" and min_bytes is not None and tensors and all(t.is_cuda for t in tensors)
                and sum(t.numel() * t.element_size() for t in tensors) >= min_bytes):
            torch.cuda.empty_cache()  # the call's freed temporaries make room for the shared copies
            try:
                return {"tensors": meta, "shared": self.exporter.export(tensors)}, b""
            except devshare.DeviceShareError as e:
                print(f"kernelevolve: outputs take the host path: {e}", file=sys.stderr)
        return {"tensors": meta}, _encode(outs)[1]

    def _check_tamper(self, when: str) -> None:
        changed = checks.tampered(self.timers)
        if changed:
            raise Fail("rejected", f"timing functions replaced after {when}: {', '.join(changed)}")
        threads = self.origins.candidate_threads(self.threads)
        if threads:
            raise Fail("rejected", f"{len(threads)} thread(s) started by the candidate still running after {when}")
        procs = checks.child_processes() - self.procs
        if procs:
            raise Fail("rejected", f"{len(procs)} child process(es) still running after {when}")

    def _sync(self) -> None:
        if self.device == "cuda":
            timing._sync()

    def _hook_triton(self) -> None:
        """Count launches of the candidate's own Triton kernels, and let a ghost run skip them."""
        if "triton" not in sys.modules and self.job.get("language") != "triton":
            return
        try:
            from triton.runtime.jit import JITFunction
        except ImportError:
            return
        classes: list[type] = [JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction

            classes.append(InterpretedFunction)
        except ImportError:
            pass
        for cls in classes:
            cls.run = self._counting_run(cls.run)

    def _counting_run(self, original: Any) -> Any:
        session = self

        def run(kernel: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(getattr(kernel, "fn", None), "__module__", None) == CANDIDATE_MODULE:
                session.launches += 1
                if session.ghost:
                    return None
            return original(kernel, *args, **kwargs)

        return run


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _backend_flags() -> dict[str, Any]:
    """The global torch settings a candidate could change and every later call would inherit."""
    return {"matmul_tf32": torch.backends.cuda.matmul.allow_tf32, "cudnn_tf32": torch.backends.cudnn.allow_tf32,
            "cudnn_benchmark": torch.backends.cudnn.benchmark, "precision": torch.get_float32_matmul_precision(),
            "dtype": torch.get_default_dtype()}


def _restore_backends(flags: dict[str, Any]) -> None:
    torch.set_float32_matmul_precision(flags["precision"])  # first: it sets the TF32 flag too
    torch.backends.cuda.matmul.allow_tf32 = flags["matmul_tf32"]
    torch.backends.cudnn.allow_tf32 = flags["cudnn_tf32"]
    torch.backends.cudnn.benchmark = flags["cudnn_benchmark"]
    torch.set_default_dtype(flags["dtype"])


@contextlib.contextmanager
def _harness_only() -> Iterator[None]:
    """The harness's own comparisons and copies, with the candidate's __torch_function__ and dispatch modes off."""
    with _no_function_modes(), _no_dispatch_modes():
        yield


def _returning(value: Any) -> Any:
    return lambda *args: value


def _spec_bytes(specs: Any) -> int:
    return sum(math.prod(shape) * dtype.itemsize for shape, dtype in specs)


def _describe(outs: list[Any]) -> tuple[list[dict[str, Any]], list[torch.Tensor]]:
    tensors = [o.detach() for o in outs if type(o) is torch.Tensor]
    return [{"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)} for t in tensors], tensors


def _encode(outs: list[Any]) -> tuple[list[dict[str, Any]], list[Any]]:
    """Exact tensors as (dtype and shape per tensor, their elements as raw row-major byte buffers): the parent rebuilds
    them from that alone, unpickling nothing. Anything else is left out, which the parent sees as a missing output."""
    meta, tensors = _describe(outs)
    # resolve_conj/resolve_neg: a lazily conjugated or negated view cannot be reinterpreted as bytes
    return meta, [t.resolve_conj().resolve_neg().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
                  for t in tensors]


def _first_configs(module: Any) -> None:
    """Under the interpreter an autotuner cannot time its configurations (there is no device to time on, and the
    timings would mean nothing): each autotuned kernel of the candidate runs its first configuration, which is the
    one checked. On a GPU the autotuner runs as written."""
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        return
    for name, value in vars(module).items():
        if isinstance(value, Autotuner) and len(value.configs) > 1:
            print(f"kernelevolve: under the interpreter, autotuned kernel {name} runs its first configuration",
                  file=sys.stderr)
            value.configs = value.configs[:1]


def _is_triton_kernel(value: Any) -> bool:
    try:
        from triton.runtime.jit import KernelInterface
    except ImportError:
        return False
    return isinstance(value, KernelInterface)

