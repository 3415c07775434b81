"""SQLite store: problems, runs, candidates (deduplicated by source hash per problem and device), results and the
search tree of each run. WAL mode, one connection per process, each result committed as soon as it is known."""
from __future__ import annotations

import datetime as dt
import json
import math
import sqlite3
from pathlib import Path
from typing import Any, Callable

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate.headtohead import HeadToHead
from kernelevolve.evaluate.result import Baseline, Result, ScreenResult
from kernelevolve.problem import Problem
from kernelevolve.profile import Profile
from kernelevolve.rows import Approval, Experience, KnownKernel, Node, Run, RunSummary, StoredProblem

SCHEMA = """
CREATE TABLE IF NOT EXISTS problems (
    sha TEXT PRIMARY KEY, name TEXT NOT NULL, path TEXT NOT NULL, source TEXT NOT NULL, created TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY, problem_sha TEXT NOT NULL REFERENCES problems(sha), device TEXT NOT NULL,
    device_key TEXT NOT NULL, config TEXT NOT NULL, status TEXT NOT NULL, created TEXT NOT NULL, finished TEXT,
    profile TEXT, baseline TEXT, versions TEXT, stop_reason TEXT, phases TEXT, head_to_head TEXT);
CREATE TABLE IF NOT EXISTS candidates (
    id INTEGER PRIMARY KEY, problem_sha TEXT NOT NULL, device_key TEXT NOT NULL, sha TEXT NOT NULL,
    source TEXT NOT NULL, language TEXT NOT NULL, created TEXT NOT NULL, UNIQUE (problem_sha, device_key, sha));
CREATE TABLE IF NOT EXISTS results (
    candidate_id INTEGER PRIMARY KEY REFERENCES candidates(id), status TEXT NOT NULL, reason TEXT NOT NULL,
    runtime_ms REAL, timed INTEGER NOT NULL, data TEXT NOT NULL, created TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nodes (
    id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id),
    candidate_id INTEGER NOT NULL REFERENCES candidates(id), parent INTEGER REFERENCES nodes(id),
    proposer TEXT NOT NULL, meta TEXT NOT NULL, cached INTEGER NOT NULL DEFAULT 0, created TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS nodes_run ON nodes(run_id);
CREATE TABLE IF NOT EXISTS screens (
    node_id INTEGER PRIMARY KEY REFERENCES nodes(id), status TEXT NOT NULL, reason TEXT NOT NULL, ms REAL,
    data TEXT NOT NULL, finalist INTEGER NOT NULL DEFAULT 0, created TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS llm_calls (
    id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id), proposer TEXT NOT NULL,
    model TEXT NOT NULL, strategy TEXT NOT NULL, parent INTEGER, status TEXT NOT NULL, detail TEXT NOT NULL,
    input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, cost_usd REAL, latency_s REAL,
    prompt_sha TEXT, created TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS llm_calls_run ON llm_calls(run_id);
CREATE TABLE IF NOT EXISTS experience (
    id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id), proposer TEXT NOT NULL,
    device_key TEXT NOT NULL, problem_sha TEXT NOT NULL, families TEXT NOT NULL, dtype TEXT, bytes REAL,
    size_bucket INTEGER, strategy TEXT, meta TEXT NOT NULL, candidate_id INTEGER NOT NULL REFERENCES candidates(id),
    runtime_ms REAL NOT NULL, speedup_eager REAL, created TEXT NOT NULL, UNIQUE (run_id, proposer));
CREATE INDEX IF NOT EXISTS experience_device ON experience(device_key);
CREATE TABLE IF NOT EXISTS approvals (
    id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id), node_id INTEGER NOT NULL REFERENCES nodes(id),
    candidate_sha TEXT NOT NULL, approved_by TEXT NOT NULL, note TEXT NOT NULL, created TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY, problem_path TEXT NOT NULL, problem_name TEXT NOT NULL, problem_source TEXT NOT NULL,
    config TEXT NOT NULL, device TEXT, out_root TEXT NOT NULL, out_dir TEXT NOT NULL, priority INTEGER NOT NULL,
    status TEXT NOT NULL, owner TEXT, heartbeat REAL, lease_s REAL, attempts INTEGER NOT NULL DEFAULT 0,
    run_id INTEGER REFERENCES runs(id), error TEXT, requeued_from INTEGER REFERENCES jobs(id), note TEXT,
    created TEXT NOT NULL, started TEXT, finished TEXT);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs(status, priority, id);
"""
# screens: what the screen found for a node (a ScreenResult as data); finalist is 1 once the node was sent on to the
# judge. A screen row never makes a node ok: only a results row does.
# jobs.status: queued, running, finished, failed or cancelled. device is what the job asked for (NULL: whatever the
# serving machine has); heartbeat is Unix seconds, renewed by the owner ("host:pid") every lease_s / 3 while it runs.
# requeued_from names the job whose problem and config a re-queued job repeats, and note says why it was queued.
# llm_calls.status: "candidate" (the reply became a candidate, whose node meta names the call), "no_code" (the reply
# held no usable file; detail says why), "repeat" (the reply repeated a candidate the run holds; detail names it) or
# "error" (the call failed: detail is the error kind and message). No prompt or key is stored.


class StoreError(Exception):
    pass


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


# The columns of runs that update_run sets: text as given, and typed values the store writes as JSON (read back by
# _run into the same types).
RUN_TEXT = frozenset({"status", "finished", "stop_reason"})
RUN_JSON: dict[str, Callable[[Any], str]] = {"profile": lambda p: json.dumps(p.to_dict()), "baseline": Baseline.to_json,
                                             "phases": json.dumps, "config": json.dumps,
                                             "head_to_head": lambda h: json.dumps(h.to_dict())}


def _run(row: sqlite3.Row) -> Run:
    loads = lambda key: json.loads(row[key]) if row[key] else None  # noqa: E731
    profile, baseline = loads("profile"), row["baseline"]
    return Run(id=row["id"], problem_sha=row["problem_sha"], device=row["device"], device_key=row["device_key"],
               config=loads("config"), status=row["status"], created=row["created"], finished=row["finished"],
               profile=Profile.from_dict(profile) if profile else None,
               baseline=Baseline.from_json(baseline) if baseline else None, versions=loads("versions") or {},
               stop_reason=row["stop_reason"], phases=loads("phases") or {},
               head_to_head=HeadToHead.from_dict(loads("head_to_head")) if row["head_to_head"] else None)


def _result(data: str) -> Result:
    return Result.from_dict(json.loads(data))


class Store:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.parent != Path(""):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(self.path), timeout=30.0)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)
        self._add_missing_columns()
        self.db.commit()
        self._backfill_experience()

    def close(self) -> None:
        self.db.close()

    def _add_missing_columns(self) -> None:
        """Columns added since a store was made: a store written by an earlier version opens with them empty."""
        have = {row[1] for row in self.db.execute("PRAGMA table_info(runs)")}
        for column in ("phases", "head_to_head"):
            if column not in have:
                self.db.execute(f"ALTER TABLE runs ADD COLUMN {column} TEXT")

    def _write(self, sql: str, args: tuple[Any, ...] = ()) -> int:
        with self.db:
            cur = self.db.execute(sql, args)
        return int(cur.lastrowid or 0)

    # --- runs -----------------------------------------------------------------------------------------------
    def create_run(self, problem: Problem, device: str, device_key: str, config: dict[str, Any],
                   versions: dict[str, Any]) -> int:
        self._write("INSERT OR IGNORE INTO problems VALUES (?,?,?,?,?)",
                    (problem.sha, problem.name, problem.path, problem.source, now()))
        return self._write(
            "INSERT INTO runs (problem_sha, device, device_key, config, status, created, versions) VALUES (?,?,?,?,?,?,?)",
            (problem.sha, device, device_key, json.dumps(config), "running", now(), json.dumps(versions)))

    def update_run(self, run_id: int, **fields: Any) -> None:
        """Set fields of a run: ``status``, ``finished`` and ``stop_reason`` (text), ``profile`` (a Profile),
        ``baseline`` (a Baseline), ``phases`` (seconds by phase), ``config`` (a resumed run's new limits) or
        ``head_to_head`` (a HeadToHead); the store
        writes them as JSON."""
        unknown = set(fields) - RUN_TEXT - set(RUN_JSON)
        if not fields or unknown:
            raise StoreError(f"cannot update run fields {sorted(unknown)}")
        cols = ", ".join(f"{k} = ?" for k in fields)
        values = (RUN_JSON[k](v) if k in RUN_JSON else v for k, v in fields.items())
        self._write(f"UPDATE runs SET {cols} WHERE id = ?", (*values, run_id))

    def run(self, run_id: int | str) -> Run:
        if run_id == "latest":
            row = self.db.execute("SELECT * FROM runs ORDER BY id DESC LIMIT 1").fetchone()
        else:
            try:
                row = self.db.execute("SELECT * FROM runs WHERE id = ?", (int(run_id),)).fetchone()
            except ValueError:
                row = None
        if row is None:
            raise StoreError(f"no run {run_id!r} in {self.path}")
        return _run(row)

    def runs(self) -> list[RunSummary]:
        rows = self.db.execute(
            "SELECT r.id, p.name, r.problem_sha, r.device, r.device_key, r.status, r.created, r.finished, "
            "r.stop_reason, (SELECT COUNT(*) FROM nodes n WHERE n.run_id = r.id) AS n_nodes, "
            "(SELECT COUNT(*) FROM nodes n JOIN screens s ON s.node_id = n.id WHERE n.run_id = r.id) AS screened, "
            "(SELECT COUNT(*) FROM nodes n JOIN results x ON x.candidate_id = n.candidate_id "
            "WHERE n.run_id = r.id AND n.cached = 0) AS evaluated "
            "FROM runs r JOIN problems p ON p.sha = r.problem_sha ORDER BY r.id").fetchall()
        return [RunSummary(**row) for row in rows]

    def problem_source(self, sha: str) -> StoredProblem:
        row = self.db.execute("SELECT * FROM problems WHERE sha = ?", (sha,)).fetchone()
        if row is None:
            raise StoreError(f"no problem {sha[:12]}")
        return StoredProblem(**row)

    # --- candidates and results -----------------------------------------------------------------------------
    def add_node(self, run_id: int, problem_sha: str, device_key: str, cand: Candidate) -> Node:
        """Record ``cand`` in the run's tree. The node comes back as ``nodes`` would read it: ``cached``, with the
        existing result, when this source was already judged for this problem and device."""
        created = now()
        meta = json.dumps(cand.meta, default=str)
        with self.db:
            self.db.execute(
                "INSERT OR IGNORE INTO candidates (problem_sha, device_key, sha, source, language, created) "
                "VALUES (?,?,?,?,?,?)", (problem_sha, device_key, cand.sha, cand.source, cand.language, created))
            cid, language = self.db.execute(
                "SELECT id, language FROM candidates WHERE problem_sha = ? AND device_key = ? AND sha = ?",
                (problem_sha, device_key, cand.sha)).fetchone()
            known = self.db.execute("SELECT data FROM results WHERE candidate_id = ?", (cid,)).fetchone()
            cur = self.db.execute(
                "INSERT INTO nodes (run_id, candidate_id, parent, proposer, meta, cached, created) VALUES (?,?,?,?,?,?,?)",
                (run_id, cid, cand.parent, cand.proposer, meta, int(known is not None), created))
        return Node(id=int(cur.lastrowid), run_id=run_id, parent=cand.parent, proposer=cand.proposer,
                    meta=json.loads(meta), cached=known is not None, created=created, candidate_id=cid, sha=cand.sha,
                    source=cand.source, language=language, result=_result(known[0]) if known else None)

    def save_result(self, node_id: int, result: Result) -> None:
        cid = self.db.execute("SELECT candidate_id FROM nodes WHERE id = ?", (node_id,)).fetchone()[0]
        self._write("INSERT OR REPLACE INTO results VALUES (?,?,?,?,?,?,?)",
                    (cid, result.status.value, result.reason, result.runtime_ms, int(result.timed),
                     json.dumps(result.to_dict(), default=str), now()))

    def nodes(self, run_id: int) -> list[Node]:
        """Every node of a run in creation order, joined with its candidate and result (None when pending)."""
        rows = self.db.execute(
            "SELECT n.id, n.run_id, n.parent, n.proposer, n.meta, n.cached, n.created, c.id AS candidate_id, c.sha, "
            "c.source, c.language, r.data, s.data AS screen, s.finalist FROM nodes n "
            "JOIN candidates c ON c.id = n.candidate_id LEFT JOIN results r ON r.candidate_id = c.id "
            "LEFT JOIN screens s ON s.node_id = n.id WHERE n.run_id = ? ORDER BY n.id", (run_id,)).fetchall()
        return [Node(id=row["id"], run_id=row["run_id"], parent=row["parent"], proposer=row["proposer"],
                     meta=json.loads(row["meta"]), cached=bool(row["cached"]), created=row["created"],
                     candidate_id=row["candidate_id"], sha=row["sha"], source=row["source"], language=row["language"],
                     result=_result(row["data"]) if row["data"] else None,
                     screen=ScreenResult.from_dict(json.loads(row["screen"])) if row["screen"] else None,
                     finalist=bool(row["finalist"])) for row in rows]

    def save_screen(self, node_id: int, screen: ScreenResult, finalist: bool = False) -> None:
        self._write("INSERT OR REPLACE INTO screens VALUES (?,?,?,?,?,?,?)",
                    (node_id, screen.status.value, screen.reason, screen.ms, json.dumps(screen.to_dict()),
                     int(finalist), now()))

    def drop_finalist(self, node_id: int, screen: ScreenResult) -> None:
        """A finalist that will not be judged after all: ``screen``, its screen result marked so, is its last word."""
        self._write("UPDATE screens SET finalist = 0, data = ? WHERE node_id = ?",
                    (json.dumps(screen.to_dict()), node_id))

    def count_screened(self, run_id: int) -> int:
        return self.db.execute("SELECT COUNT(*) FROM nodes n JOIN screens s ON s.node_id = n.id WHERE n.run_id = ?",
                               (run_id,)).fetchone()[0]

    # --- experience across runs ------------------------------------------------------------------------------
    def record_experience(self, run_id: int) -> int:
        """Record what won in a run: for each proposer, its fastest verified timed node, keyed by device model, the op
        families of the problem (from the nodes' metas), dtype and size bucket (log2 of the bytes the problem moves),
        with its strategy, its configuration (the node's meta) and its code (the candidate). Returns the rows
        written; recording a run again replaces its rows."""
        run = self.run(run_id)
        nodes = [n for n in self.nodes(run_id) if not n.meta.get("reused")]
        families = sorted({c["family"] for n in nodes for c in n.meta.get("configs", [])}
                          | {f for n in nodes for f in n.meta.get("families", [])})
        nbytes = run.profile.bytes if run.profile else None
        bucket = round(math.log2(nbytes)) if nbytes else None
        best: dict[str, tuple[Node, float]] = {}
        for n in nodes:
            ms = n.runtime_ms
            if ms is not None and (n.proposer not in best or ms < best[n.proposer][1]):
                best[n.proposer] = (n, ms)
        with self.db:
            self.db.execute("DELETE FROM experience WHERE run_id = ?", (run_id,))
            for proposer, (n, ms) in best.items():
                self.db.execute(
                    "INSERT INTO experience (run_id, proposer, device_key, problem_sha, families, dtype, bytes, "
                    "size_bucket, strategy, meta, candidate_id, runtime_ms, speedup_eager, created) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (run_id, proposer, run.device_key, run.problem_sha, json.dumps(families),
                     run.profile.dtype if run.profile else None, nbytes, bucket,
                     n.meta.get("strategy") or n.label, json.dumps(n.meta), n.candidate_id, ms,
                     n.result.speedup_eager if n.result else None, now()))
        return len(best)

    def experience(self, device_key: str, proposer: str | None, exclude_run: int | None = None,
                   limit: int = 50) -> list[Experience]:
        """Recorded winners of earlier runs on this device model (by ``proposer``, or by any proposer when None),
        fastest first."""
        rows = self.db.execute(
            "SELECT e.run_id, e.proposer, e.strategy, e.meta, e.runtime_ms AS ms, e.speedup_eager, e.problem_sha, "
            "p.name AS problem, e.families, e.dtype, e.bytes, e.size_bucket, c.source FROM experience e "
            "JOIN candidates c ON c.id = e.candidate_id JOIN problems p ON p.sha = e.problem_sha "
            "WHERE e.device_key = ? AND (? IS NULL OR e.proposer = ?) AND e.run_id != ? ORDER BY e.runtime_ms LIMIT ?",
            (device_key, proposer, proposer, exclude_run or -1, limit)).fetchall()
        return [Experience(**dict(row, meta=json.loads(row["meta"]), families=json.loads(row["families"])))
                for row in rows]

    def _backfill_experience(self) -> None:
        """Databases written before the experience table: record their finished runs once."""
        if self.db.execute("SELECT 1 FROM experience LIMIT 1").fetchone() is None:
            for (run_id,) in self.db.execute("SELECT id FROM runs WHERE status = 'finished'").fetchall():
                self.record_experience(run_id)

    def fastest_known(self, problem_sha: str, device_key: str, limit: int = 3) -> list[KnownKernel]:
        """The fastest verified, timed candidates of this problem on this device model, from any run, fastest first."""
        rows = self.db.execute(
            "SELECT c.id AS candidate_id, c.source, c.language, r.runtime_ms, "
            "(SELECT n.proposer FROM nodes n WHERE n.candidate_id = c.id ORDER BY n.id LIMIT 1) AS proposer, "
            "(SELECT n.meta FROM nodes n WHERE n.candidate_id = c.id ORDER BY n.id LIMIT 1) AS meta "
            "FROM candidates c JOIN results r ON r.candidate_id = c.id "
            "WHERE c.problem_sha = ? AND c.device_key = ? AND r.status = 'ok' AND r.timed = 1 "
            "ORDER BY r.runtime_ms LIMIT ?", (problem_sha, device_key, limit)).fetchall()
        return [KnownKernel(**dict(row, meta=json.loads(row["meta"] or "{}"))) for row in rows if row["proposer"]]

    # --- language-model calls ---------------------------------------------------------------------------------
    def add_llm_call(self, run_id: int, proposer: str, model: str, strategy: str, status: str, detail: str = "",
                     parent: int | None = None, input_tokens: int = 0, output_tokens: int = 0,
                     cost_usd: float | None = None, latency_s: float | None = None,
                     prompt_sha: str | None = None) -> int:
        return self._write(
            "INSERT INTO llm_calls (run_id, proposer, model, strategy, parent, status, detail, input_tokens, "
            "output_tokens, cost_usd, latency_s, prompt_sha, created) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (run_id, proposer, model, strategy, parent, status, detail[:2000], input_tokens, output_tokens, cost_usd,
             latency_s, prompt_sha, now()))

    def llm_calls(self, run_id: int) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT * FROM llm_calls WHERE run_id = ? ORDER BY id", (run_id,)).fetchall()
        return [dict(r) for r in rows]

    def llm_usage(self, run_id: int) -> dict[str, Any] | None:
        """Calls, failures, tokens and cost of a run's language-model calls, in all and per model; None if none."""
        calls = self.llm_calls(run_id)
        if not calls:
            return None

        def total(rows: list[dict[str, Any]]) -> dict[str, Any]:
            costs = [r["cost_usd"] for r in rows if r["cost_usd"] is not None]
            return {"calls": len(rows), "candidates": sum(r["status"] == "candidate" for r in rows),
                    "no_code": sum(r["status"] == "no_code" for r in rows),
                    "repeats": sum(r["status"] == "repeat" for r in rows),
                    "errors": sum(r["status"] == "error" for r in rows),
                    "input_tokens": sum(r["input_tokens"] for r in rows),
                    "output_tokens": sum(r["output_tokens"] for r in rows),
                    "cost_usd": sum(costs) if costs else None}

        models = sorted({r["model"] for r in calls})
        return dict(total(calls), by_model={m: total([r for r in calls if r["model"] == m]) for m in models})

    # --- approvals --------------------------------------------------------------------------------------------
    def add_approval(self, run_id: int, node_id: int, candidate_sha: str, by: str, note: str) -> Approval:
        if not note.strip():
            raise StoreError("an approval needs a note: what was reviewed, and why it may ship")
        aid = self._write("INSERT INTO approvals (run_id, node_id, candidate_sha, approved_by, note, created) "
                          "VALUES (?,?,?,?,?,?)", (run_id, node_id, candidate_sha, by, note, now()))
        return Approval(**self.db.execute("SELECT * FROM approvals WHERE id = ?", (aid,)).fetchone())

    def approvals(self, run_id: int, node_id: int | None = None) -> list[Approval]:
        rows = self.db.execute("SELECT * FROM approvals WHERE run_id = ? AND (? IS NULL OR node_id = ?) ORDER BY id",
                               (run_id, node_id, node_id)).fetchall()
        return [Approval(**r) for r in rows]

    # --- jobs (service mode) ----------------------------------------------------------------------------------
    def add_job(self, problem_path: str, problem_name: str, problem_source: str, config: dict[str, Any],
                out_root: str, out_dir: str | None = None, priority: int = 0, note: str | None = None) -> int:
        """Queue a job; its out dir defaults to ``out_root/job-<id>``."""
        with self.db:
            cur = self.db.execute(
                "INSERT INTO jobs (problem_path, problem_name, problem_source, config, device, out_root, out_dir, "
                "priority, status, note, created) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (problem_path, problem_name, problem_source, json.dumps(config), config.get("device"), out_root,
                 out_dir or "", priority, "queued", note, now()))
            job_id = int(cur.lastrowid)
            if not out_dir:
                self.db.execute("UPDATE jobs SET out_dir = ? WHERE id = ?", (str(Path(out_root) / f"job-{job_id}"),
                                                                            job_id))
        return job_id

    def requeue_job(self, job_id: int, note: str, once: bool = False, device: str | None = None) -> int | None:
        """Queue a new job with the problem, config and priority of job ``job_id`` (on ``device`` when the job left
        its device to the server). With ``once``, only when no job was re-queued from it yet (checked in the same
        statement, so concurrent callers queue it once). Returns the new job's id, or None when ``once`` found it
        already re-queued."""
        self.job(job_id)
        with self.db:
            cur = self.db.execute(
                "INSERT INTO jobs (problem_path, problem_name, problem_source, config, device, out_root, out_dir, "
                "priority, status, requeued_from, note, created) SELECT problem_path, problem_name, problem_source, "
                "json_set(config, '$.device', COALESCE(device, ?)), COALESCE(device, ?), out_root, '', priority, "
                "'queued', id, ?, ? FROM jobs WHERE id = ? "
                "AND (? = 0 OR NOT EXISTS (SELECT 1 FROM jobs WHERE requeued_from = ?))",
                (device, device, note, now(), job_id, int(once), job_id))
            if cur.rowcount == 0:
                return None
            new_id = int(cur.lastrowid)
            self.db.execute("UPDATE jobs SET out_dir = out_root || '/job-' || id WHERE id = ?", (new_id,))
        return new_id

    def job(self, job_id: int | str) -> dict[str, Any]:
        try:
            row = self.db.execute("SELECT * FROM jobs WHERE id = ?", (int(job_id),)).fetchone()
        except ValueError:
            row = None
        if row is None:
            raise StoreError(f"no job {job_id!r} in {self.path}")
        return dict(row, config=json.loads(row["config"]))

    def jobs(self, status: str | None = None) -> list[dict[str, Any]]:
        """Every job (or those with ``status``) without its source, with its run's device, device key, versions,
        eager time, fastest verified timed runtime (``best_ms``; None when nothing was timed) and the number of
        evaluations its run has made so far (``evaluated``)."""
        rows = self.db.execute(
            "SELECT j.id, j.problem_path, j.problem_name, j.config, j.device, j.out_dir, j.priority, j.status, "
            "j.owner, j.heartbeat, j.attempts, j.run_id, j.error, j.requeued_from, j.note, j.created, j.started, "
            "j.finished, r.device AS run_device, r.device_key, r.versions, r.status AS run_status, "
            "json_extract(r.baseline, '$.eager.median_ms') AS eager_ms, "
            "(SELECT MIN(res.runtime_ms) FROM nodes n JOIN results res ON res.candidate_id = n.candidate_id "
            " WHERE n.run_id = j.run_id AND res.status = 'ok' AND res.timed = 1) AS best_ms, "
            "(SELECT COUNT(*) FROM nodes n JOIN results res ON res.candidate_id = n.candidate_id "
            " WHERE n.run_id = j.run_id AND n.cached = 0) AS evaluated "
            "FROM jobs j LEFT JOIN runs r ON r.id = j.run_id WHERE (? IS NULL OR j.status = ?) ORDER BY j.id",
            (status, status)).fetchall()
        return [dict(row, config=json.loads(row["config"]),
                     versions=json.loads(row["versions"]) if row["versions"] else None) for row in rows]

    def update_job(self, job_id: int, held_by: str | None = None, when_status: str | None = None,
                   **fields: Any) -> bool:
        """Set ``fields`` of a job; with ``held_by``, only while that owner holds it, and with ``when_status``, only
        while it has that status (checked in the same statement). Returns whether the job was changed."""
        allowed = {"status", "owner", "heartbeat", "lease_s", "attempts", "run_id", "error", "started", "finished"}
        if not fields or set(fields) - allowed:
            raise StoreError(f"cannot update job fields {sorted(set(fields) - allowed)}")
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self.db:
            cur = self.db.execute(f"UPDATE jobs SET {cols} WHERE id = ? AND (? IS NULL OR owner = ?) "
                                  "AND (? IS NULL OR status = ?)",
                                  (*fields.values(), job_id, held_by, held_by, when_status, when_status))
        return cur.rowcount > 0

    def count_evaluated(self, run_id: int) -> int:
        return self.db.execute(
            "SELECT COUNT(*) FROM nodes n JOIN results r ON r.candidate_id = n.candidate_id "
            "WHERE n.run_id = ? AND n.cached = 0", (run_id,)).fetchone()[0]
