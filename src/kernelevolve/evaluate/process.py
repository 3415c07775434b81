"""Child processes for evaluation: a fork server with torch preloaded, hard deadlines and process-group kills."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import mmap
import multiprocessing as mp
import multiprocessing.connection
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
import time
from typing import Any, Iterator

from kernelevolve.evaluate import checks

_LOCK = threading.Lock()
_CTX: Any = None
WATCHDOG_GRACE_S = 1.0  # past the deadline, for the one wait that the deadline cannot bound: a frame half sent


class ChildTimeout(Exception):
    pass


class ChildDied(Exception):
    def __init__(self, exitcode: int | None):
        super().__init__(describe_exit(exitcode))
        self.exitcode = exitcode


def describe_exit(code: int | None) -> str:
    if code is None:
        return "the process closed its channel and did not exit"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}"
    return f"exited with code {code} before finishing"


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _server_environment() -> dict[str, str]:
    env = checks.scrub_environment(dict(os.environ))
    env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    return env


def _server_pid() -> int | None:
    from multiprocessing import forkserver

    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def _server_alive() -> bool:
    pid = _server_pid()
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        # gone from a /proc that exists: dead and reaped; no /proc at all: trust multiprocessing's own check
        return not os.path.isdir("/proc/self")


def _await_server_death(timeout_s: float = 5.0) -> None:
    from multiprocessing import forkserver

    end = time.monotonic() + timeout_s
    while _server_alive() and time.monotonic() < end:
        time.sleep(0.05)
    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if _server_alive() and pid is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _ensure_server() -> None:
    """(Re)start the fork server with secrets removed from its environment, so that no child can read them even from
    /proc/self/environ. A candidate can kill the server; multiprocessing would then restart it with the parent's full
    environment, so it is restarted here first. The environment is swapped only then, under the lock (changing it
    while other threads read it is unsafe), which is rare."""
    if _server_alive():
        return
    from multiprocessing import forkserver

    with _environment(_server_environment()):
        forkserver.ensure_running()


def _preload_triton() -> bool:
    """Triton decides at import whether it interprets; CPU children set TRITON_INTERPRET themselves, so the server
    imports triton ahead only where candidates will compile it for a GPU."""
    import torch

    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    return importlib.util.find_spec("triton") is not None and (interpreted or torch.cuda.is_available())


def context() -> Any:
    """The fork-server context, with torch (and triton) already imported in the server."""
    global _CTX
    with _LOCK:
        if _CTX is None:
            ctx = mp.get_context("forkserver")
            preload = ["torch"] + (["triton"] if _preload_triton() else [])
            ctx.set_forkserver_preload(preload + ["kernelevolve.evaluate.worker"])
            sweep_stale_blob_dirs()
            _ensure_server()
            _CTX = ctx
    return _CTX


BLOB_PREFIX = "kernelevolve-blobs-"


def _blob_dir() -> str | None:
    """A private folder for large outputs, in memory (/dev/shm) where the system has it. Its name carries this
    process's pid, so that folders left by a controller killed with -9 can be swept later."""
    for base in ("/dev/shm", None):
        try:
            return tempfile.mkdtemp(prefix=f"{BLOB_PREFIX}{os.getpid()}-", dir=base)
        except OSError:
            continue
    return None


def sweep_stale_blob_dirs() -> None:
    """Remove blob folders whose controller is no longer running."""
    for base in ("/dev/shm", tempfile.gettempdir()):
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            m = re.fullmatch(re.escape(BLOB_PREFIX) + r"(\d+)-\w+", name)
            if m and not pid_alive(int(m.group(1))):
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs: a zombie (exited, not yet reaped) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True  # no /proc to ask: kill's answer stands


class Child:
    """One evaluation process and its message channel, with a hard deadline for everything it does."""

    def __init__(self, job: dict[str, Any], timeout_s: float):
        from kernelevolve.evaluate.worker import child_main

        self.blob_dir = _blob_dir()
        self.expired = False
        self._early: tuple[dict[str, Any], Any] | None = None
        try:
            job = dict(job, blob_dir=self.blob_dir)
            ctx = context()
            self.deadline = time.monotonic() + timeout_s
            self.conn, child_conn = ctx.Pipe(duplex=True)
            try:
                self._start(ctx, child_main, child_conn, job)
            finally:
                child_conn.close()
        except BaseException:
            if hasattr(self, "conn"):
                self.conn.close()
            if self.blob_dir:
                shutil.rmtree(self.blob_dir, ignore_errors=True)
            raise
        # recv_bytes() blocks once a frame has begun: a child that writes a frame's length and no more (the candidate
        # can reach its channel) would hold the parent past the deadline. Killing it ends the read with EOF.
        self._watchdog = threading.Timer(max(timeout_s, 0.0) + WATCHDOG_GRACE_S, self._expire)
        self._watchdog.daemon = True
        self._watchdog.start()

    def pause(self) -> None:
        """Stop the deadline's clock while the parent, not the child, works (comparing what it was sent)."""
        self._watchdog.cancel()
        self.deadline = float("inf")

    def renew(self, timeout_s: float) -> None:
        """A fresh deadline from now, for a child that answers a sequence of commands each with its own deadline
        (a screen batch, a candidate at a time)."""
        self._watchdog.cancel()
        if self.expired:
            raise ChildTimeout()
        self.deadline = time.monotonic() + timeout_s
        self._watchdog = threading.Timer(max(timeout_s, 0.0) + WATCHDOG_GRACE_S, self._expire)
        self._watchdog.daemon = True
        self._watchdog.start()

    def _start(self, ctx: Any, target: Any, child_conn: Any, job: dict[str, Any]) -> None:
        # A candidate that SIGKILLed the server may leave it dying but not yet dead when we look: the fork request
        # then fails with EOF. Wait for it to die and start a fresh one, once.
        for attempt in range(2):
            try:
                with _LOCK:
                    _ensure_server()
                    job = dict(job, server_pid=_server_pid())  # the child's parent: it dies with it
                    self.proc = ctx.Process(target=target, args=(child_conn, job), daemon=True)
                    self.proc.start()
                return
            except (EOFError, ConnectionError):
                if attempt:
                    raise
                _await_server_death()

    def send(self, cmd: dict[str, Any]) -> None:
        try:
            self.conn.send_bytes(json.dumps(cmd).encode())
        except (OSError, ValueError) as e:
            if self._early is not None:
                raise ChildDied(self._exitcode()) from e
            # The child may have answered before it exited (a failure found after its last reply, such as tampering
            # during timing): keep that answer for recv. With nothing left to read, recv raises ChildDied.
            self._early = self.recv()

    def recv(self) -> tuple[dict[str, Any], bytes | bytearray | memoryview]:
        """The next message: (JSON header, blob). Raises ChildTimeout past the deadline, ChildDied on EOF."""
        if self._early is not None:
            early, self._early = self._early, None
            return early
        remaining = self.deadline - time.monotonic()
        if remaining <= 0 or self.expired:
            raise ChildTimeout()
        ready = mp.connection.wait([self.conn, self.proc.sentinel], timeout=remaining)
        if not ready:
            raise ChildTimeout()
        if self.conn in ready or self.conn.poll(0):
            try:
                data = self.conn.recv_bytes()
            except (EOFError, OSError) as e:
                if self.expired:
                    raise ChildTimeout() from e
                raise ChildDied(self._exitcode()) from e
            cut = data.index(b"\n") if b"\n" in data else len(data)
            try:
                header = json.loads(data[:cut])
            except (ValueError, RecursionError) as e:
                raise ChildDied(self._exitcode()) from e
            if not isinstance(header, dict):
                raise ChildDied(self._exitcode())
            if "blob_file" in header:
                return header, self._read_blob(header)
            blob = memoryview(data)[cut + 1:]
            return header, blob
        if self.expired:
            raise ChildTimeout()
        raise ChildDied(self._exitcode())

    def _read_blob(self, header: dict[str, Any]) -> bytearray | memoryview:
        """A blob the child wrote to a file in this evaluation's blob folder: only a name of the expected form, inside
        that folder, and exactly the size the header gives. The file is mapped, not read: in /dev/shm its pages are
        memory already, and a private mapping is writable without a copy (outputs of many GB would otherwise be held
        twice in host memory, the file's and the copy's)."""
        name, size = str(header.pop("blob_file")), int(header.pop("blob_bytes", -1))
        if not self.blob_dir or not re.fullmatch(r"\d+-\d+\.bin", name):
            return bytearray()
        path = os.path.join(self.blob_dir, name)
        try:
            # The child can write into the folder: never follow its links, nor block opening its FIFOs.
            with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    return bytearray()
                if st.st_size != size:
                    return bytearray()
                if size == 0:
                    data: bytearray | memoryview = bytearray()
                else:
                    data = memoryview(mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE))
            os.unlink(path)
        except (OSError, ValueError):
            return bytearray()
        return data

    def _exitcode(self) -> int | None:
        self.proc.join(timeout=2.0)
        return self.proc.exitcode

    def _expire(self) -> None:
        self.expired = True
        self._kill_processes()

    def _kill_processes(self) -> None:
        pid = self.proc.pid
        if pid is not None:
            checks.kill_children(pid)  # daemons in their own session, adopted by the child (a subreaper)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.kill()

    def kill(self) -> None:
        """Kill the child's whole process group (it called setsid), then the child itself."""
        self._watchdog.cancel()
        self._kill_processes()
        self.proc.join(timeout=5.0)
        with contextlib.suppress(Exception):
            self.conn.close()
        if self.blob_dir:
            shutil.rmtree(self.blob_dir, ignore_errors=True)

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()
