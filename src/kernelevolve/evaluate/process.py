"""Child processes for evaluation: a fork server with torch preloaded, hard deadlines and process-group kills."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import multiprocessing as mp
import multiprocessing.connection
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from typing import Any, Iterator

from kernelevolve.evaluate import checks

_LOCK = threading.Lock()
_CTX: Any = None


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


def context() -> Any:
    """The fork-server context. The server is started once with secrets removed from its environment, so that no
    child can read them even from /proc/self/environ, and with torch (and triton) already imported."""
    global _CTX
    with _LOCK:
        if _CTX is None:
            ctx = mp.get_context("forkserver")
            preload = ["torch"] + (["triton"] if importlib.util.find_spec("triton") else [])
            ctx.set_forkserver_preload(preload + ["kernelevolve.evaluate.worker"])
            env = checks.scrub_environment(dict(os.environ))
            env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
            with _environment(env):
                from multiprocessing import forkserver

                forkserver.ensure_running()
            _CTX = ctx
    return _CTX


def _blob_dir() -> str | None:
    """A private folder for large outputs, in memory (/dev/shm) where the system has it."""
    for base in ("/dev/shm", None):
        try:
            return tempfile.mkdtemp(prefix="kernelevolve-", dir=base)
        except OSError:
            continue
    return None


class Child:
    """One evaluation process and its message channel, with a hard deadline for everything it does."""

    def __init__(self, job: dict[str, Any], timeout_s: float):
        from kernelevolve.evaluate.worker import child_main

        self.blob_dir = _blob_dir()
        job = dict(job, blob_dir=self.blob_dir)
        ctx = context()
        self.deadline = time.monotonic() + timeout_s
        self.conn, child_conn = ctx.Pipe(duplex=True)
        with _LOCK:  # the fork server's environment is fixed; starting is cheap
            self.proc = ctx.Process(target=child_main, args=(child_conn, job), daemon=True)
            self.proc.start()
        child_conn.close()

    def send(self, cmd: dict[str, Any]) -> None:
        try:
            self.conn.send_bytes(json.dumps(cmd).encode())
        except (OSError, ValueError) as e:
            raise ChildDied(self._exitcode()) from e

    def recv(self) -> tuple[dict[str, Any], bytes | bytearray | memoryview]:
        """The next message: (JSON header, blob). Raises ChildTimeout past the deadline, ChildDied on EOF."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise ChildTimeout()
        ready = mp.connection.wait([self.conn, self.proc.sentinel], timeout=remaining)
        if not ready:
            raise ChildTimeout()
        if self.conn in ready or self.conn.poll(0):
            try:
                data = self.conn.recv_bytes()
            except (EOFError, OSError) as e:
                raise ChildDied(self._exitcode()) from e
            cut = data.index(b"\n") if b"\n" in data else len(data)
            try:
                header = json.loads(data[:cut])
            except ValueError as e:
                raise ChildDied(self._exitcode()) from e
            if not isinstance(header, dict):
                raise ChildDied(self._exitcode())
            if "blob_file" in header:
                return header, self._read_blob(header)
            blob = memoryview(data)[cut + 1:]
            return header, blob
        raise ChildDied(self._exitcode())

    def _read_blob(self, header: dict[str, Any]) -> bytearray:
        """A blob the child wrote to a file in this evaluation's blob folder: only a name of the expected form, inside
        that folder, and exactly the size the header gives."""
        name, size = str(header.pop("blob_file")), int(header.pop("blob_bytes", -1))
        if not self.blob_dir or not re.fullmatch(r"\d+-\d+\.bin", name):
            return bytearray()
        path = os.path.join(self.blob_dir, name)
        try:
            with open(path, "rb") as f:
                data = bytearray(os.fstat(f.fileno()).st_size)
                f.readinto(data)
            os.unlink(path)
        except OSError:
            return bytearray()
        return data if len(data) == size else bytearray()

    def _exitcode(self) -> int | None:
        self.proc.join(timeout=2.0)
        return self.proc.exitcode

    def kill(self) -> None:
        """Kill the child's whole process group (it called setsid), then the child itself."""
        pid = self.proc.pid
        if pid is not None:
            checks.kill_children(pid)  # daemons in their own session, adopted by the child (a subreaper)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.kill()
        self.proc.join(timeout=5.0)
        with contextlib.suppress(Exception):
            self.conn.close()
        if self.blob_dir:
            shutil.rmtree(self.blob_dir, ignore_errors=True)

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()
