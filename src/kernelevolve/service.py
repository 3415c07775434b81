"""Service mode: a queue of optimization jobs kept in the store, and servers that run them one at a time.

Any number of servers share one queue. A job is claimed inside a ``BEGIN IMMEDIATE`` transaction (one writer at a
time), so exactly one claimer wins it. While a server runs a job, a thread of its own renews the job's heartbeat. A
running job whose server is gone (same host, pid gone) or silent for longer than its lease is reclaimed by any server,
the restarted one included, and continued from its run: every evaluation committed before is kept."""
from __future__ import annotations

import logging
import os
import socket
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch

from kernelevolve.evaluate.process import pid_alive
from kernelevolve.machine import default_device, device_key, versions
from kernelevolve.optimize import OptimizeConfig, RunOutcome, optimize
from kernelevolve.problem import read_source
from kernelevolve.store import Store, now

log = logging.getLogger(__name__)

STATUSES = ("queued", "running", "finished", "failed", "cancelled")
MAX_ATTEMPTS = 3  # claims of one job; a job abandoned this often (its server died each time) is marked failed
DEFAULT_LEASE_S = 60.0
Say = Callable[[str], None]


class JobError(Exception):
    """A job request that cannot be carried out, such as cancelling a job that is already running."""


def local_devices() -> tuple[str, ...]:
    return ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)


def this_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_alive(owner: str) -> bool | None:
    """Whether the server ``owner`` ("host:pid", with an optional ":tag") still runs; None when it runs on another
    host, where only its heartbeat can tell."""
    host, _, rest = owner.partition(":")
    pid = rest.split(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return None
    return pid_alive(int(pid))


# --- submitting ---------------------------------------------------------------------------------------------------
def submit(store: Store, problem_path: str | Path, config: dict[str, Any], out_root: str | Path = "kernelevolve-jobs",
           out_dir: str | Path | None = None, priority: int = 0) -> int:
    """Queue an optimization of ``problem_path`` (its path and source are stored) with ``config`` (an
    OptimizeConfig dict whose ``device`` may be None: the serving machine's cuda, else cpu). Returns the job id."""
    path = Path(problem_path).absolute()
    source = read_source(path)
    return store.add_job(str(path), path.stem, source, config, str(Path(out_root).absolute()),
                         str(Path(out_dir).absolute()) if out_dir else None, priority)


# --- the queue ----------------------------------------------------------------------------------------------------
class JobQueue:
    """Claims, finishes and fails jobs for one owner (a server); reclaims the jobs of dead or silent owners."""

    def __init__(self, store: Store, owner: str | None = None, lease_s: float = DEFAULT_LEASE_S,
                 max_attempts: int = MAX_ATTEMPTS, devices: tuple[str, ...] | None = None):
        self.store, self.owner, self.lease_s = store, owner or this_owner(), lease_s
        self.max_attempts = max_attempts
        self.devices = devices or local_devices()

    def claim(self) -> dict[str, Any] | None:
        """Take the next job this server can run: an abandoned running job first (to be continued), else the queued
        job of highest priority, oldest first. None when there is none. The returned job carries ``reclaimed``: why
        it was taken from its previous owner, or None."""
        db = self.store.db
        db.execute("BEGIN IMMEDIATE")  # holds the write lock from the first read: no two claimers see one job free
        try:
            job = self._pick(db, time.time())
            db.commit()
        except BaseException:
            db.rollback()
            raise
        return job

    def _pick(self, db: sqlite3.Connection, t: float) -> dict[str, Any] | None:
        runnable = f"(device IS NULL OR device IN ({','.join('?' * len(self.devices))}))"
        for row in db.execute(f"SELECT * FROM jobs WHERE status = 'running' AND {runnable} "
                              "ORDER BY priority DESC, id", self.devices).fetchall():
            why = self.abandoned(dict(row), t)
            if why is None:
                continue
            if row["attempts"] >= self.max_attempts:
                db.execute("UPDATE jobs SET status = 'failed', error = ?, finished = ? WHERE id = ?",
                           (f"gave up after {row['attempts']} attempts; the last ended when {why}", now(), row["id"]))
                log.warning("job %d: gave up after %d attempts (%s)", row["id"], row["attempts"], why)
                continue
            return self._take(db, row["id"], t, why)
        row = db.execute(f"SELECT id FROM jobs WHERE status = 'queued' AND {runnable} "
                         "ORDER BY priority DESC, id LIMIT 1", self.devices).fetchone()
        return None if row is None else self._take(db, row["id"], t, None)

    def _take(self, db: sqlite3.Connection, job_id: int, t: float, why: str | None) -> dict[str, Any]:
        db.execute("UPDATE jobs SET status = 'running', owner = ?, heartbeat = ?, lease_s = ?, "
                   "attempts = attempts + 1, started = COALESCE(started, ?) WHERE id = ?",
                   (self.owner, t, self.lease_s, now(), job_id))
        return dict(self.store.job(job_id), reclaimed=why)

    def abandoned(self, job: dict[str, Any], t: float) -> str | None:
        """Why a running job is no longer served (its owner's process is gone, or its heartbeat is older than the
        owner's lease), or None while it is."""
        owner = job["owner"] or ""
        if owner == self.owner:
            return None
        if owner and owner_alive(owner) is False:
            return f"its server {owner} was gone"
        lease = job["lease_s"] or self.lease_s
        if job["heartbeat"] is None or t - job["heartbeat"] > lease:
            silent = "ever" if job["heartbeat"] is None else f"{t - job['heartbeat']:.0f} s"
            return f"its server {owner or '?'} had sent no heartbeat for {silent} (lease {lease:g} s)"
        return None

    def finish(self, job_id: int, run_id: int) -> bool:
        return self.store.update_job(job_id, held_by=self.owner, status="finished", run_id=run_id, error=None,
                                     finished=now())

    def fail(self, job_id: int, error: str) -> bool:
        return self.store.update_job(job_id, held_by=self.owner, status="failed", error=error, finished=now())

    def release(self, job_id: int) -> bool:
        """Give a job back to the queue (the server was interrupted); this attempt does not count."""
        job = self.store.job(job_id)
        return self.store.update_job(job_id, held_by=self.owner, status="queued", owner=None, heartbeat=None,
                                     attempts=max(0, job["attempts"] - 1))


def cancel(store: Store, job_id: int | str) -> None:
    job = store.job(job_id)
    if not store.update_job(job["id"], when_status="queued", status="cancelled", finished=now()):
        raise JobError(f"job {job['id']} is {store.job(job['id'])['status']}; only a queued job can be cancelled")


# --- re-queueing ----------------------------------------------------------------------------------------------------
def requeue(store: Store, job_id: int | str) -> int:
    """Queue a new job with the problem and config of job ``job_id``, whatever its state."""
    job = store.job(job_id)
    new_id = store.requeue_job(job["id"], f"re-queued by hand from job {job['id']}")
    assert new_id is not None
    return new_id


def stale_reason(job: dict[str, Any], here: dict[str, Any], keys: dict[str, str]) -> str | None:
    """Why a finished job's run no longer holds on this machine (another device model, other torch or triton), or
    None. ``keys`` maps each device to this machine's device key; a run on a device not in it is not judged."""
    device = job.get("run_device")
    if job.get("run_id") is None or device not in keys:
        return None
    why = []
    if job["device_key"] != keys[device]:
        why.append(f"measured on {job['device_key']}, this machine's {device} is {keys[device]}")
    old = job.get("versions") or {}
    why += [f"{lib} {old.get(lib)} (now {here.get(lib)})" for lib in ("torch", "triton")
            if old.get(lib) != here.get(lib)]
    return "; ".join(why) or None


def requeue_stale(store: Store, devices: tuple[str, ...] | None = None) -> list[tuple[int, int, str]]:
    """Queue a new job for each finished job whose run is stale here (see stale_reason), at most once per job, with
    the run's device. Returns (old job, new job, why) for each one queued."""
    keys = {d: device_key(d) for d in devices or local_devices()}
    here = versions()
    queued = []
    for job in store.jobs("finished"):
        why = stale_reason(job, here, keys)
        if why is not None:
            new_id = store.requeue_job(job["id"], f"stale: {why}", once=True, device=job["run_device"])
            if new_id is not None:
                queued.append((job["id"], new_id, why))
    return queued


# --- serving --------------------------------------------------------------------------------------------------------
class Heartbeat:
    """Renews a running job's heartbeat every ``every_s`` seconds from a thread with its own connection (a sqlite3
    connection belongs to the thread that opened it). Stops when the job is no longer held by ``owner``."""

    def __init__(self, db_path: str | Path, job_id: int, owner: str, every_s: float):
        self.db_path, self.job_id, self.owner, self.every_s = str(db_path), job_id, owner, every_s
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"kernelevolve-heartbeat-{job_id}", daemon=True)

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        con = sqlite3.connect(self.db_path, timeout=30.0)
        try:
            while not self._stop.wait(self.every_s):
                try:
                    with con:
                        cur = con.execute("UPDATE jobs SET heartbeat = ? WHERE id = ? AND owner = ? AND "
                                          "status = 'running'", (time.time(), self.job_id, self.owner))
                except sqlite3.Error as e:
                    log.warning("job %d: heartbeat not written: %s", self.job_id, e)
                    continue
                if cur.rowcount == 0:
                    self.lost = True
                    log.warning("job %d is no longer held by %s (reclaimed after a missed lease?)", self.job_id,
                                self.owner)
                    return
        finally:
            con.close()


def job_config(job: dict[str, Any]) -> OptimizeConfig:
    return OptimizeConfig.from_dict(dict(job["config"], device=job["config"].get("device") or default_device()))


def problem_file(job: dict[str, Any]) -> Path:
    """The job's problem file when it still holds the submitted source, else a copy of that source in the job's out
    dir (same file name, so the problem keeps its name)."""
    path = Path(job["problem_path"])
    try:
        if path.read_text() == job["problem_source"]:
            return path
    except (OSError, UnicodeDecodeError):
        pass
    copy = Path(job["out_dir"]) / "problem" / path.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    if not copy.is_file() or copy.read_text() != job["problem_source"]:
        copy.write_text(job["problem_source"])
    return copy


def one_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else 'no message'}"[:500]


def describe(outcome: RunOutcome) -> str:
    text = f"{outcome.search.evaluations} evaluation(s), stopped: {outcome.search.stop_reason}"
    best = outcome.best_result
    if best is None:
        return text + "; no candidate was verified"
    if best.speedup_eager is None:
        return text + "; best verified candidate untimed"
    return text + f"; best {best.speedup_eager:.2f}x vs eager ({best.runtime_ms:.4g} ms)"


def run_job(queue: JobQueue, job: dict[str, Any], say: Say) -> str:
    """Run (or continue) one claimed job to its end; returns its final status. An exception from the run fails the
    job with a one-line error; Ctrl-C gives the job back to the queue and propagates."""
    store, jid, name = queue.store, job["id"], job["problem_name"]
    resume = job["run_id"]
    try:
        cfg = job_config(job)
        path = problem_file(job)
    except (OSError, TypeError, ValueError) as e:
        queue.fail(jid, one_line(e))
        say(f"job {jid} failed: {name}: {one_line(e)}")
        return "failed"
    said = f"job {jid} started: {name} on {cfg.device}" + (f", continuing run {resume}" if resume else "")
    if job.get("reclaimed"):
        said += f" (attempt {job['attempts']}: {job['reclaimed']})"
    say(said + ("" if path == Path(job["problem_path"]) else f"; {job['problem_path']} changed, running the submitted "
                                                             f"copy {path}"))
    try:
        with Heartbeat(store.path, jid, queue.owner, queue.lease_s / 3):
            # the run id is kept the moment the run exists, so a server killed at any later point resumes that run
            outcome = optimize(path, cfg, store, Path(job["out_dir"]), resume=resume,
                               on_run=lambda run_id: store.update_job(jid, run_id=run_id))
    except KeyboardInterrupt:
        queue.release(jid)
        raise
    except Exception as e:  # the service boundary: whatever one job raises, the server goes on to the next
        log.debug("job %d failed", jid, exc_info=True)
        run_id = store.job(jid)["run_id"]
        queue.fail(jid, one_line(e))
        say(f"job {jid} failed: {name}{f', run {run_id}' if run_id else ''}: {one_line(e)}")
        return "failed"
    if not queue.finish(jid, outcome.run_id):
        say(f"job {jid}: run {outcome.run_id} ended, but the job had been reclaimed by another server")
        return store.job(jid)["status"]
    say(f"job {jid} finished: {name}, run {outcome.run_id}: {describe(outcome)}")
    return "finished"


def serve(db: str | Path, once: bool = False, poll_s: float = 5.0, max_jobs: int | None = None,
          lease_s: float = DEFAULT_LEASE_S, say: Say = log.info, owner: str | None = None) -> int:
    """Run queued jobs until interrupted (with ``once``: until none is left to claim, or after ``max_jobs``).
    Returns the number of jobs run."""
    store = Store(db)
    queue = JobQueue(store, owner, lease_s)
    done = 0
    try:
        while max_jobs is None or done < max_jobs:
            job = queue.claim()
            if job is None:
                if once:
                    break
                time.sleep(poll_s)
                continue
            run_job(queue, job, say)
            done += 1
    finally:
        store.close()
    return done


__all__ = ["DEFAULT_LEASE_S", "Heartbeat", "JobError", "JobQueue", "MAX_ATTEMPTS", "STATUSES", "cancel",
           "local_devices", "owner_alive", "requeue", "requeue_stale", "run_job", "serve", "stale_reason", "submit"]
