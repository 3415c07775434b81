"""Service mode: the job queue (claims, reclaims, cancel, re-queue) in process, then real `kernelevolve serve`
processes on the CPU: a job run to the end, two servers sharing a queue, and a server killed with -9 mid-job whose
restart continues the same run."""
from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from kernelevolve import service
from kernelevolve.cli import main
from kernelevolve.machine import device_key, versions
from kernelevolve.problem import Problem, source_sha
from kernelevolve.service import JobError, JobQueue, Heartbeat, requeue_stale
from kernelevolve.store import Store, StoreError

CLI = [sys.executable, "-m", "kernelevolve.cli"]
# Triton candidates run in the interpreter (untimed, about 0.4 s per evaluation of this problem); a 1 ms timing
# budget keeps the reference's timing short.
FAST = ["--device", "cpu", "--proposer", "template", "--timing-budget-ms", "1", "--timeout", "120"]
ENV = dict(os.environ, TRITON_INTERPRET="1")
HOST = socket.gethostname()

PROBLEM = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * {scale}


def get_inputs():
    return [torch.randn(256, 256)]


def get_init_inputs():
    return []
'''


def write_problem(d: Path, name: str, scale: float = 2.0) -> Path:
    path = d / f"{name}.py"
    path.write_text(PROBLEM.format(scale=scale))
    return path


def submit(db: Path, problem: Path, *args: str, own_process: bool = False) -> int:
    """`kernelevolve submit`: in this process by default (the same code path, without an interpreter's start-up)."""
    if own_process:
        out = subprocess.run(CLI + ["submit", str(problem), "--db", str(db), *args], capture_output=True, text=True,
                             env=ENV, timeout=120)
        assert out.returncode == 0, out.stderr
        return int(out.stdout)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["submit", str(problem), "--db", str(db), *args]) == 0
    return int(buf.getvalue())


def ke(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, env=ENV, timeout=timeout, cwd=Path.cwd())


def rows(db: Path, sql: str, *params) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as con:
        return con.execute(sql, params).fetchall()


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # jobs' default out dirs (./kernelevolve-jobs/job-N) land in the test's folder


@pytest.fixture
def store(tmp_path: Path):
    s = Store(tmp_path / "ke.db")
    yield s
    s.close()


def add_jobs(store: Store, tmp_path: Path, n: int, **config) -> list[int]:
    src = PROBLEM.format(scale=2.0)
    return [store.add_job(str(tmp_path / f"p{i}.py"), f"p{i}", src, {"device": "cpu", **config}, str(tmp_path / "out"))
            for i in range(n)]


def set_running(store: Store, job_id: int, owner: str, heartbeat: float | None, attempts: int = 1,
                run_id: int | None = None) -> None:
    store.update_job(job_id, status="running", owner=owner, heartbeat=heartbeat, lease_s=30.0, attempts=attempts,
                     run_id=run_id)


# --- the queue, in process ------------------------------------------------------------------------------------------
def test_claim_race_gives_every_job_to_exactly_one_claimer(store, tmp_path):
    ids = add_jobs(store, tmp_path, 24)
    start = threading.Barrier(8)
    claimed: dict[int, list[int]] = {}

    def claimer(i: int) -> None:
        own = Store(store.path)  # a connection per thread, as a process per server would have
        queue = JobQueue(own, owner=f"{HOST}:{os.getpid()}:t{i}", devices=("cpu",))
        start.wait()
        mine = claimed.setdefault(i, [])
        while (job := queue.claim()) is not None:
            mine.append(job["id"])
        own.close()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    every = [j for got in claimed.values() for j in got]
    assert sorted(every) == ids, "a job was claimed twice, or not at all"
    for i, got in claimed.items():
        for j in got:
            job = store.job(j)
            assert job["owner"] == f"{HOST}:{os.getpid()}:t{i}" and job["attempts"] == 1 and job["status"] == "running"


def test_priority_then_age_and_device(store, tmp_path):
    low, high, cuda_only, anywhere = add_jobs(store, tmp_path, 4)
    store.db.execute("UPDATE jobs SET priority = 5 WHERE id = ?", (high,))
    store.db.execute("UPDATE jobs SET device = 'cuda' WHERE id = ?", (cuda_only,))
    store.db.execute("UPDATE jobs SET device = NULL WHERE id = ?", (anywhere,))
    store.db.commit()
    queue = JobQueue(store, owner=f"{HOST}:{os.getpid()}:cpu-only", devices=("cpu",))
    assert [queue.claim()["id"] for _ in range(3)] == [high, low, anywhere]
    assert queue.claim() is None  # the cuda job waits for a server that has CUDA
    assert store.job(cuda_only)["status"] == "queued"


def test_stale_heartbeat_is_reclaimed_and_a_fresh_one_is_not(store, tmp_path):
    stale, fresh, orphan = add_jobs(store, tmp_path, 3)
    set_running(store, stale, "otherhost:11", time.time() - 1000)  # another host: only its heartbeat can tell
    set_running(store, fresh, "otherhost:12", time.time())
    set_running(store, orphan, f"{HOST}:{dead_pid()}", time.time())  # this host, its process gone: no need to wait
    queue = JobQueue(store, owner=f"{HOST}:{os.getpid()}:reclaimer", lease_s=30.0)
    first, second = queue.claim(), queue.claim()
    assert {first["id"], second["id"]} == {stale, orphan}
    by_id = {j["id"]: j for j in (first, second)}
    assert "no heartbeat" in by_id[stale]["reclaimed"] and "was gone" in by_id[orphan]["reclaimed"]
    assert all(j["attempts"] == 2 and j["owner"] == queue.owner for j in (first, second))
    assert queue.claim() is None
    assert store.job(fresh)["owner"] == "otherhost:12" and store.job(fresh)["attempts"] == 1


def test_a_job_abandoned_too_often_fails(store, tmp_path):
    (job,) = add_jobs(store, tmp_path, 1)
    set_running(store, job, "otherhost:13", time.time() - 1000, attempts=service.MAX_ATTEMPTS)
    assert JobQueue(store, owner=f"{HOST}:{os.getpid()}:x").claim() is None
    failed = store.job(job)
    assert failed["status"] == "failed" and f"gave up after {service.MAX_ATTEMPTS} attempts" in failed["error"]


def test_heartbeat_thread_renews_and_notices_a_lost_job(store, tmp_path):
    (job,) = add_jobs(store, tmp_path, 1)
    owner = f"{HOST}:{os.getpid()}:beat"
    set_running(store, job, owner, 0.0)
    with Heartbeat(store.path, job, owner, 0.05) as beat:
        time.sleep(0.3)
        assert time.time() - store.job(job)["heartbeat"] < 1.0
        store.update_job(job, owner="someone-else")
        time.sleep(0.3)
    assert beat.lost


# --- serve in process, with a stand-in for optimize -----------------------------------------------------------------
def fake_outcome(run_id: int) -> SimpleNamespace:
    return SimpleNamespace(run_id=run_id, best_result=None,
                           search=SimpleNamespace(evaluations=2, stop_reason="reached --max-evals 2"))


def test_serve_fails_a_raising_job_with_one_line_and_goes_on(tmp_path, monkeypatch):
    db = tmp_path / "ke.db"
    first, second = write_problem(tmp_path, "first"), write_problem(tmp_path, "second", 3.0)
    j1, j2 = submit(db, first, *FAST), submit(db, second, *FAST)
    calls = []

    def optimize(path, cfg, store, out_dir, resume=None, on_run=None):
        problem = Problem(str(path), Path(path).read_text(), source_sha(Path(path).read_text()), Path(path).stem)
        run_id = store.create_run(problem, cfg.device, "cpu:test", cfg.to_dict(), versions())
        on_run(run_id)
        assert [j["run_id"] for j in store.jobs("running")] == [run_id]  # known before the run goes on
        calls.append((Path(path).name, resume))
        if Path(path).stem == "first":
            raise ValueError("the search exploded\nsecond line of detail")
        return fake_outcome(run_id)

    monkeypatch.setattr(service, "optimize", optimize)
    said: list[str] = []
    assert service.serve(db, once=True, say=said.append) == 2
    store = Store(db)
    failed, finished = store.job(j1), store.job(j2)
    assert failed["status"] == "failed" and failed["error"] == "ValueError: the search exploded"
    assert failed["run_id"] == 1 and finished["status"] == "finished" and finished["run_id"] == 2
    assert calls == [("first.py", None), ("second.py", None)]
    assert said[0].startswith(f"job {j1} started: first on cpu")
    assert said[1] == f"job {j1} failed: first, run 1: ValueError: the search exploded"
    assert said[3].startswith(f"job {j2} finished: second, run 2: 2 evaluation(s)")
    store.close()


def test_a_reclaimed_job_continues_its_run_from_the_submitted_source(tmp_path, monkeypatch):
    db = tmp_path / "ke.db"
    path = write_problem(tmp_path, "moved")
    job = submit(db, path, *FAST)
    store = Store(db)
    set_running(store, job, f"{HOST}:{dead_pid()}", time.time(), run_id=7)
    store.close()
    path.write_text(PROBLEM.format(scale=9.0))  # edited after submission: the stored source is what runs
    seen = {}

    def optimize(problem_path, cfg, store, out_dir, resume=None, on_run=None):
        seen.update(path=Path(problem_path), resume=resume, out_dir=out_dir, t0=time.time())
        time.sleep(0.4)  # several heartbeats at lease 0.3 s
        return fake_outcome(7)

    monkeypatch.setattr(service, "optimize", optimize)
    said: list[str] = []
    assert service.serve(db, once=True, lease_s=0.3, say=said.append) == 1
    assert seen["resume"] == 7
    assert seen["path"] == seen["out_dir"] / "problem" / "moved.py"
    assert seen["path"].read_text() == PROBLEM.format(scale=2.0)
    assert "continuing run 7 (attempt 2: its server" in said[0] and "changed" in said[0]
    store = Store(db)
    done = store.job(job)
    assert done["status"] == "finished" and done["attempts"] == 2
    assert done["heartbeat"] >= seen["t0"] + 0.05  # renewed by the heartbeat thread while the run went on
    store.close()


# --- cancel, unknown ids, re-queue ----------------------------------------------------------------------------------
def test_cancel_and_unknown_ids(tmp_path, capsys):
    db = tmp_path / "ke.db"
    job = submit(db, write_problem(tmp_path, "p"), *FAST)
    capsys.readouterr()
    assert main(["jobs", "--db", str(db), "--cancel", str(job)]) == 0
    assert Store(db).job(job)["status"] == "cancelled"
    for args in (["jobs", "--cancel", str(job)], ["jobs", "--cancel", "99"], ["jobs", "--requeue", "99"],
                 ["jobs", "--cancel", "x"], ["submit", str(tmp_path / "absent.py"), *FAST],
                 ["serve", "--once", "--lease", "0"]):
        capsys.readouterr()
        assert main([*args, "--db", str(db)]) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("kernelevolve: error: ") and "Traceback" not in err[0], err
    capsys.readouterr()
    main(["jobs", "--db", str(db), "--cancel", str(job)])
    assert f"job {job} is cancelled; only a queued job can be cancelled" in capsys.readouterr().err
    with pytest.raises(JobError):
        service.cancel(Store(db), job)
    with pytest.raises(StoreError, match="no job"):
        Store(db).job(42)
    capsys.readouterr()
    assert main(["serve", "--once", "--db", str(tmp_path / "absent.db")]) == 2
    assert main(["jobs", "--db", str(tmp_path / "absent.db")]) == 2
    assert not (tmp_path / "absent.db").exists()


def test_requeue_stale_once_and_requeue_by_hand(store, tmp_path, capsys):
    here = versions()
    problem = Problem(str(tmp_path / "p.py"), "x = 1\n", source_sha("x = 1\n"), "p")
    current, old_torch, other_device, unfinished = add_jobs(store, tmp_path, 4)
    store.db.execute("UPDATE jobs SET device = NULL, config = json_set(config, '$.device', NULL) WHERE id = ?",
                     (other_device,))
    store.db.commit()
    runs = {current: (device_key("cpu"), here), old_torch: (device_key("cpu"), dict(here, torch="1.13.0")),
            other_device: ("cpu:some-other-model", here), unfinished: ("cpu:some-other-model", here)}
    for job, (key, vers) in runs.items():
        run = store.create_run(problem, "cpu", key, {}, vers)
        status = "running" if job == unfinished else "finished"
        store.update_job(job, status=status, run_id=run)

    queued = requeue_stale(store, ("cpu",))
    assert [(old, why.split(" ")[0]) for old, _, why in queued] == [(old_torch, "torch"), (other_device, "measured")]
    for old, new, why in queued:
        job = store.job(new)
        assert job["status"] == "queued" and job["requeued_from"] == old and why in job["note"]
        assert job["problem_source"] == store.job(old)["problem_source"]
        assert job["device"] == "cpu" and job["config"]["device"] == "cpu"  # pinned to the stale run's device
        assert job["out_dir"].endswith(f"/job-{new}")
    assert requeue_stale(store, ("cpu",)) == []  # once per stale job

    capsys.readouterr()
    assert main(["jobs", "--db", str(store.path), "--requeue-stale"]) == 0
    assert "no finished job is stale" in capsys.readouterr().out
    assert main(["jobs", "--db", str(store.path), "--requeue", str(current)]) == 0
    assert main(["jobs", "--db", str(store.path), "--requeue", str(current)]) == 0  # by hand: unconditional
    again = [j for j in store.jobs() if j["requeued_from"] == current]
    assert len(again) == 2 and all(j["status"] == "queued" for j in again)


def test_submit_shares_the_optimize_flags(tmp_path):
    from kernelevolve.cli import build_parser, optimize_config

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    flags = {name: {s for a in sub[name]._actions for s in a.option_strings} for name in ("optimize", "submit")}
    assert flags["optimize"] - flags["submit"] == {"--resume"}
    assert flags["submit"] - flags["optimize"] == {"--out-root", "--priority"}
    args = parser.parse_args(["submit", "p.py", "--proposer", "template", "--max-evals", "3", "--stall", "0"])
    assert optimize_config(args, "cpu").to_dict() == optimize_config(parser.parse_args(
        ["optimize", "p.py", "--proposer", "template", "--max-evals", "3", "--stall", "0"]), "cpu").to_dict()
    db = tmp_path / "ke.db"
    job = Store(db).job(submit(db, write_problem(tmp_path, "p"), "--proposer", "template", "--priority", "3"))
    assert job["device"] is None and job["config"]["device"] is None and job["priority"] == 3
    assert job["out_dir"] == str(Path.cwd() / "kernelevolve-jobs" / f"job-{job['id']}")
    with pytest.raises(SystemExit):
        parser.parse_args(["submit", "p.py", "--resume", "1"])
    assert main(["submit", str(tmp_path / "p.py"), "--db", str(db), "--executor", "ray"]) == 2


# --- real servers ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_submit_then_serve_once_runs_it_to_the_end(tmp_path):
    db, root = tmp_path / "ke.db", tmp_path / "jobs"
    job = submit(db, write_problem(tmp_path, "relu2"), *FAST, "--max-evals", "2", "--out-root", str(root),
                 own_process=True)
    assert rows(db, "SELECT status, attempts FROM jobs") == [("queued", 0)]
    served = ke("serve", "--once", "--db", str(db))
    assert served.returncode == 0, served.stdout + served.stderr
    assert f"job {job} started: relu2 on cpu" in served.stdout and f"job {job} finished: relu2, run 1" in served.stdout
    assert (root / f"job-{job}" / "best.py").is_file() and (root / f"job-{job}" / "report.html").is_file()

    listed = ke("jobs", "--db", str(db), "--json")
    assert listed.returncode == 0, listed.stderr
    (view,) = json.loads(listed.stdout)
    assert view["id"] == job and view["status"] == "finished" and view["run_id"] == 1 and view["attempts"] == 1
    assert view["problem"] == "relu2" and view["device_key"] == device_key("cpu") and view["finished"]
    assert view["evaluated"] == rows(db, "SELECT COUNT(*) FROM nodes WHERE cached = 0")[0][0] and view["max_evals"] == 2
    table = ke("jobs", "--db", str(db))
    assert table.returncode == 0 and "relu2" in table.stdout and "finished" in table.stdout
    assert f"{view['evaluated']}/2" in table.stdout


@pytest.mark.slow
def test_two_servers_run_every_job_exactly_once(tmp_path):
    db = tmp_path / "ke.db"
    jobs = [submit(db, write_problem(tmp_path, f"p{i}", 2.0 + i), *FAST, "--max-evals", "2") for i in range(3)]
    servers = [subprocess.Popen(CLI + ["serve", "--once", "--db", str(db), "--poll", "0.2"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=ENV, cwd=tmp_path) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in servers]
    assert [p.returncode for p in servers] == [0, 0], outs
    started = [line.split()[1] for out, _ in outs for line in out.splitlines() if " started: " in line]
    assert sorted(map(int, started)) == jobs, outs  # each job started once, by one server
    table = rows(db, "SELECT j.id, j.status, j.attempts, j.owner, j.run_id, r.problem_sha, j.problem_source, "
                     "(SELECT COUNT(*) FROM nodes n WHERE n.run_id = r.id) FROM jobs j JOIN runs r ON r.id = j.run_id")
    assert len(table) == 3 and len({t[4] for t in table}) == 3
    assert rows(db, "SELECT COUNT(*) FROM runs") == [(3,)]
    pids = {f"{HOST}:{p.pid}" for p in servers}
    for _, status, attempts, owner, _, sha, source, nodes in table:
        assert (status, attempts, nodes) == ("finished", 1, 2) and owner in pids and sha == source_sha(source)
    assert all((tmp_path / "kernelevolve-jobs" / f"job-{j}" / "best.py").is_file() for j in jobs)


@pytest.mark.slow
def test_kill_9_mid_job_then_restart_continues_the_same_run(tmp_path):
    db, max_evals = tmp_path / "ke.db", 8
    job = submit(db, write_problem(tmp_path, "killed"), *FAST, "--max-evals", str(max_evals), "--stall", "0",
                 "--out-root", str(tmp_path / "jobs"))
    server = subprocess.Popen(CLI + ["serve", "--once", "--db", str(db)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=ENV, start_new_session=True)
    evaluated = "SELECT n.id, c.sha, r.status FROM nodes n JOIN candidates c ON c.id = n.candidate_id " \
                "JOIN results r ON r.candidate_id = c.id WHERE n.run_id = ? ORDER BY n.id"
    deadline, run_id = time.monotonic() + 300, None
    while server.poll() is None and time.monotonic() < deadline:
        run_id = rows(db, "SELECT run_id FROM jobs WHERE id = ?", job)[0][0] if db.exists() else None
        if run_id and rows(db, evaluated, run_id):
            break
        time.sleep(0.1)
    assert server.poll() is None, "the job ended before its server could be killed"
    os.killpg(server.pid, signal.SIGKILL)
    server.wait()
    before = rows(db, evaluated, run_id)
    assert 1 <= len(before) < max_evals
    assert rows(db, "SELECT status, attempts, owner FROM jobs") == [("running", 1, f"{HOST}:{server.pid}")]

    restarted = ke("serve", "--once", "--db", str(db))
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert f"continuing run {run_id} (attempt 2: its server {HOST}:{server.pid} was gone)" in restarted.stdout
    after = rows(db, evaluated, run_id)
    assert set(before) <= set(after), "evaluations committed before the kill were lost"
    assert len(after) == max_evals, after
    assert rows(db, "SELECT status, attempts, run_id FROM jobs") == [("finished", 2, run_id)]
    assert rows(db, "SELECT id, status FROM runs") == [(run_id, "finished")]
    assert (tmp_path / "jobs" / f"job-{job}" / "best.py").is_file()
