"""Ray executor: each evaluation is one Ray task on a cluster node.

The task rebuilds the problem on its node and runs the same ``Evaluator`` as local workers, so the harness's rules hold
unchanged there: a fresh child process per candidate, its hard timeout, crash isolation, a scrubbed environment. The
Result travels back as JSON; tasks never touch the store, which the controller alone writes. A task lost with its
worker or node is retried ``retries`` times and then recorded as ``crashed``; one still running past its deadline (the
evaluator's timeout for every attempt, plus a margin) is cancelled and recorded as ``timeout``. Ray is optional and
imported only here, when a pool is made.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import asdict, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

import kernelevolve
from kernelevolve.candidate import Candidate
from kernelevolve.engine import ExecutorError
from kernelevolve.evaluate import Baseline, EvalConfig, Evaluator, Result, Status, TimingConfig
from kernelevolve.evaluate.headtohead import HeadToHead
from kernelevolve.evaluate.result import ScreenResult
from kernelevolve.evaluate.screen import ScreenConfig
from kernelevolve.evaluate.process import pid_alive
from kernelevolve.problem import Problem

log = logging.getLogger(__name__)

INSTALL_HINT = 'pip install "kernelevolve[ray]"'
CONNECT_TIMEOUT_S = 3.0
# ray.init keeps retrying an address held by a server that is not Ray's (measured: still at it after 6 minutes against
# another gRPC server); past this it counts as unreachable.
INIT_TIMEOUT_S = 60.0
# The first task starts a worker process (importing torch) and may wait for a free slot on a busy cluster.
PROBE_TIMEOUT_S = 120.0
# Allowed past the evaluator's own timeout, for what surrounds it on the node: a fresh worker process (every GPU task
# gets one), importing torch, building the reference, starting the fork server, returning the result.
DEADLINE_MARGIN_S = 120.0
SHUTDOWN_GRACE_S = 5.0
# The client half of an HTTP/2 connection preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, the Ray
# Client server) answers with its own SETTINGS frame (type 4 in the fourth byte of the frame header).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_SETTINGS = 4


class _Lost(Exception):
    """The task was lost with its worker or node (after Ray's retries), or cancelled."""


class _Expired(Exception):
    """No answer within the controller's deadline; the task was cancelled."""


def _import_ray() -> ModuleType:
    try:
        import ray
    except ImportError as e:
        raise ExecutorError(f"the Ray executor needs Ray: {INSTALL_HINT}") from e
    return ray


# --- reaching the cluster ---------------------------------------------------------------------------------------------
def parse_address(address: str) -> tuple[str, int] | None:
    """(host, port) of a ``HOST:PORT`` or ``ray://HOST:PORT`` address; None for 'auto' and 'local', which Ray
    resolves itself."""
    if address in ("auto", "local"):
        return None
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ExecutorError(f"bad Ray address {address!r}: expected HOST:PORT, ray://HOST:PORT or auto")
    return host.strip("[]"), int(port)


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Raise ExecutorError at once when no gRPC server answers at ``address``: ray.init would retry for minutes."""
    target = parse_address(address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=timeout_s) as sock:
            if os.environ.get("RAY_USE_TLS", "0") in ("", "0"):  # a TLS server would not answer a plain preface
                sock.sendall(_H2_PREFACE)
                reply = _recv_at_least(sock, 4)
                if len(reply) < 4 or reply[3] != _SETTINGS:
                    raise ExecutorError(f"cannot reach the Ray cluster at {address}: port {target[1]} answers, "
                                        f"but not as a Ray server")
    except socket.timeout:
        raise ExecutorError(f"cannot reach the Ray cluster at {address}: no answer within {timeout_s:g} s") from None
    except OSError as e:
        raise ExecutorError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}") from None


def _recv_at_least(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except ConnectionError:
            break
        if not chunk:
            break
        data += chunk
    return data


class _NoSignalWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler" not in record.getMessage()


def connect(address: str | None) -> bool:
    """Connect this process to the cluster at ``address`` (None: Ray's own default, RAY_ADDRESS or a new local
    instance). Returns True when this call connected, and so should disconnect at the end."""
    ray = _import_ray()
    if ray.is_initialized():
        return False
    if address:
        check_reachable(address)
    where = address or "a new local Ray instance"
    outcome: dict[str, BaseException | None] = {}

    def init() -> None:
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
            outcome["error"] = None
        except BaseException as e:  # noqa: BLE001 - carried to the caller
            outcome["error"] = e

    # On a thread, so that a server that accepts but never completes the handshake cannot hold the caller. Off the
    # main thread Ray installs no SIGTERM handler (one that exits cleanly) and warns; a terminated controller is still
    # noticed by the cluster, which ends its tasks, and the store survives any kill.
    ray_worker_log = logging.getLogger("ray._private.worker")
    quiet = _NoSignalWarning()
    ray_worker_log.addFilter(quiet)
    try:
        thread = threading.Thread(target=init, name="kernelevolve-ray-init", daemon=True)
        thread.start()
        thread.join(INIT_TIMEOUT_S)
    finally:
        ray_worker_log.removeFilter(quiet)
    if "error" not in outcome:
        raise ExecutorError(f"cannot reach the Ray cluster at {where}: no connection within {INIT_TIMEOUT_S:g} s")
    if outcome["error"] is not None:
        raise ExecutorError(f"cannot connect to the Ray cluster at {where}: {describe(outcome['error'])}") \
            from outcome["error"]
    return True


# --- what went wrong --------------------------------------------------------------------------------------------------
def describe(error: BaseException) -> str:
    """One line for an error raised in a task or by Ray itself: the task's own exception where there is one."""
    cause = getattr(error, "cause", None) or error
    text = str(cause)
    missing = re.search(r"No module named '[^']+'", text)
    if missing:
        return f"ModuleNotFoundError: {missing.group(0)}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f"{type(cause).__name__}: {lines[0] if lines else ''}"[:300]


def lost_reason(error: BaseException) -> str | None:
    """The one-line reason when ``error`` says a task was lost with its worker or node (a system failure, which Ray
    retries); None when the task's own code raised."""
    from ray import exceptions as rx

    system = (rx.WorkerCrashedError, rx.NodeDiedError, rx.ObjectLostError, rx.LocalRayletDiedError,
              rx.RaySystemError, rx.OutOfMemoryError)
    cause = error.cause if isinstance(error, rx.RayTaskError) else error
    return describe(cause) if isinstance(cause, system) else None


# --- on the worker node -----------------------------------------------------------------------------------------------
_WORK_ROOT = "kernelevolve-ray"
_cached: tuple[str, Evaluator] | None = None  # one problem per worker process: the last one it evaluated


def _worker_evaluator(problem: dict[str, Any], config: dict[str, Any]) -> Evaluator:
    """The evaluator for this problem and config, built once per worker process. The problem is rebuilt from its
    source, since the controller's path may not exist on this node."""
    global _cached
    key = problem["sha"] + json.dumps(config, sort_keys=True)
    if _cached is not None and _cached[0] == key:
        return _cached[1]
    _release()
    root = Path(tempfile.gettempdir()) / f"{_WORK_ROOT}-{os.getuid()}"
    root.mkdir(mode=0o700, exist_ok=True)
    _sweep(root)
    work = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-{problem['sha'][:12]}-", dir=root))
    path = work / "problem.py"
    path.write_text(problem["source"])
    cfg = EvalConfig(**dict(config, timing=TimingConfig(**config["timing"])))
    evaluator = Evaluator(Problem(**dict(problem, path=str(path))), cfg, work / "eval")
    _cached = (key, evaluator)
    return evaluator


def _release() -> None:
    global _cached
    if _cached is not None:
        shutil.rmtree(_cached[1].workdir.parent, ignore_errors=True)
        _cached = None


def _sweep(root: Path) -> None:
    """Remove the folders of worker processes that are gone (a GPU task's worker exits after one task)."""
    for entry in root.iterdir():
        pid = entry.name.split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def _where() -> dict[str, Any]:
    import ray

    return {"host": socket.gethostname(), "node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}


def _evaluate_task(problem: dict[str, Any], config: dict[str, Any], source: str, language: str,
                   gpu: int | None) -> str:
    try:
        result = _worker_evaluator(problem, config).evaluate(Candidate(source, language=language), gpu=gpu)
    finally:
        if config["device"] == "cuda":  # the worker exits after this task: nothing to keep
            _release()
    result = replace(result, details={**result.details, "ray": _where()})
    return json.dumps(result.to_dict(), default=str)


def _screen_task(problem: dict[str, Any], config: dict[str, Any], screen: dict[str, Any],
                 candidates: list[tuple[str, str, str]], gpu: int | None) -> str:
    from kernelevolve.evaluate.screen import Screener

    cfg = ScreenConfig(**dict(screen, timing=TimingConfig(**screen["timing"])))
    try:
        with Screener(_worker_evaluator(problem, config), cfg) as screener:
            results = screener.screen([Candidate(source, language=language, proposer=proposer)
                                       for source, language, proposer in candidates], gpu=gpu)
    finally:
        if config["device"] == "cuda":
            _release()
    return json.dumps([r.to_dict() for r in results])


def _baseline_task(problem: dict[str, Any], config: dict[str, Any], compiled: bool, gpu: int | None) -> str:
    try:
        return _worker_evaluator(problem, config).baseline(gpu=gpu, compiled=compiled).to_json()
    finally:
        if config["device"] == "cuda":
            _release()


def _head_to_head_task(problem: dict[str, Any], config: dict[str, Any], source: str, language: str,
                       sides: list[str], gpu: int | None) -> str:
    from kernelevolve.evaluate.evaluator import HeadToHeadError

    evaluator = _worker_evaluator(problem, config)
    try:
        h2h = evaluator.head_to_head(Candidate(source, language=language), sides, gpu=gpu)
    except HeadToHeadError as e:
        h2h = HeadToHead.failed(evaluator.config.timing.clock, str(e))
    finally:
        if config["device"] == "cuda":
            _release()
    return json.dumps(h2h.to_dict())


def _probe_task(device: str) -> dict[str, Any]:
    from kernelevolve.machine import device_key

    return {"device_key": device_key(device), "version": kernelevolve.__version__, **_where()}


# --- the controller's side --------------------------------------------------------------------------------------------
def package_root() -> str:
    """The folder that holds the kernelevolve package: what a worker's PYTHONPATH needs when it is not installed."""
    return str(Path(kernelevolve.__file__).resolve().parent.parent)


def cluster_workers(ray: ModuleType, device: str, accelerator: str | None = None) -> int:
    """One evaluation per GPU of the cluster for cuda (of the ``accelerator`` type when given), per CPU for cpu."""
    if device != "cuda":
        return max(1, int(ray.cluster_resources().get("CPU", 0)))
    key = f"accelerator_type:{accelerator}"
    nodes = [n for n in ray.nodes() if n.get("Alive") and (accelerator is None or key in n.get("Resources", {}))]
    return max(1, int(sum(n.get("Resources", {}).get("GPU", 0) for n in nodes)))


def node_accelerator(ray: ModuleType, node_id: str) -> str | None:
    """The GPU model Ray detected on a node (its ``accelerator_type:NAME`` resource), if any."""
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            names = [k.split(":", 1)[1] for k in node.get("Resources", {}) if k.startswith("accelerator_type:")]
            return names[0] if names else None
    return None


class RayPool:
    """The pool interface of engine/__init__.py over a Ray cluster: each ``submit`` is one Ray task (``num_gpus=1``
    for cuda, ``num_cpus=1`` for cpu) that evaluates the candidate on a node, in a fresh child process there."""

    def __init__(self, evaluator: Evaluator, workers: int | None = None, address: str | None = None,
                 retries: int = 2, margin_s: float = DEADLINE_MARGIN_S, screen: ScreenConfig | None = None):
        if retries < 0:
            raise ExecutorError(f"--ray-retries must be 0 or more, not {retries}")
        self.evaluator, self.address, self.retries, self.margin_s = evaluator, address, retries, margin_s
        self.screen_config = screen or ScreenConfig()
        self.device = evaluator.config.device
        self._ray = _import_ray()
        self._owns_ray = connect(address)
        self._refs: set[Any] = set()
        self._futures: set[Future[Result]] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._runtime_env: dict[str, Any] | None = None
        self._accelerator: str | None = None
        try:
            if self.device == "cuda" and not self._ray.cluster_resources().get("GPU"):
                raise ExecutorError(f"the Ray cluster at {address or 'auto'} has no GPU: add GPU nodes, or use "
                                    f"--device cpu")
            self._tasks = self._remote_functions()
            self._info = self._probe()
            if self.device == "cuda":
                # Timings are comparable within one GPU model only (the run's device key): every task goes to nodes
                # of the model the probe found.
                self._accelerator = node_accelerator(self._ray, self._info["node"])
            self.workers = workers or cluster_workers(self._ray, self.device, self._accelerator)
        except BaseException:
            self._disconnect()
            raise
        if self._info.get("version") != kernelevolve.__version__:
            log.warning("kernelevolve %s on the Ray workers, %s here", self._info.get("version"),
                        kernelevolve.__version__)
        self._problem = asdict(evaluator.problem)
        self._config = asdict(evaluator.config)
        # Ray counts a GPU task's devices within the CUDA_VISIBLE_DEVICES it sets, so the assigned GPU is index 0 there
        # (and the evaluator's child resolves index 0 within the same variable).
        self._gpu = 0 if self.device == "cuda" else None
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="kernelevolve-ray")

    def _remote_functions(self) -> dict[str, Any]:
        # A GPU task gets a fresh worker process (max_calls=1, Ray's default for GPU tasks, kept on purpose): a reused
        # one would hold CUDA state, and a fork server, bound to the GPU of its first task.
        resources = {"num_gpus": 1, "max_calls": 1} if self.device == "cuda" else {"num_cpus": 1}
        remote = self._ray.remote(**resources)
        return {"evaluate": remote(_evaluate_task), "baseline": remote(_baseline_task), "probe": remote(_probe_task),
                "screen": remote(_screen_task), "head_to_head": remote(_head_to_head_task)}

    def _start(self, name: str, *args: Any) -> Any:
        options: dict[str, Any] = {"max_retries": self.retries, "retry_exceptions": False}
        if self._runtime_env:
            options["runtime_env"] = self._runtime_env
        if self._accelerator:
            options["accelerator_type"] = self._accelerator
        return self._tasks[name].options(**options).remote(*args)

    def _deadline_s(self, attempt_s: float) -> float:
        """Every attempt may use the evaluator's full timeout: a node lost late in one leaves the next the whole."""
        return (self.retries + 1) * attempt_s + self.margin_s

    def _await(self, ref: Any, timeout_s: float) -> Any:
        """The task's return value. Raises _Expired past ``timeout_s`` (after cancelling the task), _Lost for a task
        lost with its worker or node, and ExecutorError for a failure of the task's own code."""
        ray = self._ray
        with self._lock:
            self._refs.add(ref)
        try:
            ready, _ = ray.wait([ref], timeout=timeout_s)
            if not ready:
                ray.cancel(ref, force=True)
                raise _Expired(f"no answer from the Ray task within {timeout_s:g} s; the task was cancelled")
            try:
                return ray.get(ref)
            except ray.exceptions.TaskCancelledError as e:
                raise _Lost("cancelled: the pool was shut down") from e
            except ray.exceptions.RayError as e:
                reason = lost_reason(e)
                if reason is None:
                    raise ExecutorError(f"a Ray task failed: {describe(e)}") from e
                raise _Lost(f"lost with its Ray worker or node after {self.retries} "
                            f"retr{'y' if self.retries == 1 else 'ies'}: {reason}") from e
        finally:
            with self._lock:
                self._refs.discard(ref)

    def _probe(self) -> dict[str, Any]:
        """Run one task as evaluations will run (same resources), which also reads the device key there. When the
        workers cannot import kernelevolve, try again with this package's folder on their PYTHONPATH."""
        error: Exception | None = None
        for env in (None, {"env_vars": {"PYTHONPATH": f"{package_root()}{os.pathsep}${{PYTHONPATH}}"}}):
            self._runtime_env = env
            try:
                return self._await(self._start("probe", self.device), PROBE_TIMEOUT_S)
            except ExecutorError as e:
                error = e
            except _Expired as e:
                raise ExecutorError(f"no Ray worker ran a task within {PROBE_TIMEOUT_S:g} s: the cluster at "
                                    f"{self.address or 'auto'} is busy, or has no node with a free "
                                    f"{'GPU' if self.device == 'cuda' else 'CPU'}") from e
            except _Lost as e:
                raise ExecutorError(f"the first Ray task was {e}") from e
        raise ExecutorError(f"kernelevolve does not run on the Ray workers ({error}); install it there "
                            f"(pip install kernelevolve), or make {package_root()} visible to them") from error

    # --- the pool interface -------------------------------------------------------------------------------------------
    def baseline(self, compiled: bool = True) -> Baseline:
        """Time the reference on a worker node (the controller may have no GPU)."""
        timeout_s = self.evaluator.config.timeout_s * (2 if compiled else 1)
        try:
            text = self._await(self._start("baseline", self._problem, self._config, compiled, self._gpu),
                               self._deadline_s(timeout_s))
        except (_Expired, _Lost) as e:
            log.warning("baseline: %s", e)
            return Baseline(self.device, None, None, None, str(e))
        return Baseline.from_json(text)

    def head_to_head(self, candidate: Candidate, sides: Sequence[str]) -> HeadToHead:
        """The winner against the baselines on one worker node: every side there, in its own process."""
        timeout_s = self.evaluator.config.timeout_s * (1 + len(sides))
        clock = self.evaluator.config.timing.clock
        try:
            text = self._await(self._start("head_to_head", self._problem, self._config, candidate.source,
                                           candidate.language, list(sides), self._gpu), self._deadline_s(timeout_s))
        except (_Expired, _Lost) as e:
            return HeadToHead.failed(clock, str(e))
        return HeadToHead.from_dict(json.loads(text))

    def device_key(self) -> str:
        """The device model as a worker reports it (``kernelevolve.machine.device_key`` run there)."""
        return str(self._info["device_key"])

    def submit(self, candidate: Candidate) -> Future[Result]:
        future = self._pool.submit(self._evaluate, candidate)
        with self._lock:
            self._futures.add(future)
        future.add_done_callback(self._forget)
        return future

    def screen(self, candidates: list[Candidate]) -> Future[list[ScreenResult]]:
        """Screen a batch as one task on a cluster node. A batch lost with its node, or past its deadline (the
        screen's timeout for every candidate in both stages), comes back as that failure for each candidate."""
        future = self._pool.submit(self._screen, candidates)
        with self._lock:
            self._futures.add(future)
        future.add_done_callback(self._forget)
        return future

    def _screen(self, candidates: list[Candidate]) -> list[ScreenResult]:
        cfg = self.screen_config
        ref = self._start("screen", self._problem, self._config, asdict(cfg),
                          [(c.source, c.language, c.proposer) for c in candidates], self._gpu)
        try:
            text = self._await(ref, self._deadline_s(2 * cfg.timeout_s * max(1, len(candidates))))
        except (_Expired, _Lost) as e:  # the batch as a whole: no candidate's fault; each goes to the judge
            return [ScreenResult(Status.RUNTIME_ERROR, f"not screened: {e}", harness=True)] * len(candidates)
        return [ScreenResult.from_dict(d) for d in json.loads(text)]

    def _forget(self, future: Future[Result]) -> None:
        with self._lock:
            self._futures.discard(future)

    def _evaluate(self, candidate: Candidate) -> Result:
        ref = self._start("evaluate", self._problem, self._config, candidate.source, candidate.language, self._gpu)
        try:
            text = self._await(ref, self._deadline_s(self.evaluator.config.timeout_s))
        except _Expired as e:
            return Result(Status.TIMEOUT, str(e))
        except _Lost as e:
            return Result(Status.CRASHED, str(e))
        return Result.from_dict(json.loads(text))

    def shutdown(self, wait: bool = True) -> None:
        """Finish (wait=True) or cancel (wait=False) outstanding evaluations; disconnect if this pool connected."""
        if self._closed:
            return
        self._closed = True
        if not wait:
            with self._lock:
                refs, futures = list(self._refs), list(self._futures)
            for ref in refs:
                try:
                    self._ray.cancel(ref, force=True)
                except Exception as e:  # noqa: BLE001 - already finished or lost: nothing to cancel
                    log.debug("cancel: %s", e)
            self._pool.shutdown(wait=False, cancel_futures=True)
            _, pending = wait_futures(futures, timeout=SHUTDOWN_GRACE_S)
            if pending:  # threads still inside Ray calls: leave the disconnection to Ray's exit hook
                return
        else:
            self._pool.shutdown(wait=True)
        self._disconnect()

    def _disconnect(self) -> None:
        if self._owns_ray:
            self._owns_ray = False
            self._ray.shutdown()
