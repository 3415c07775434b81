"""Store: runs, the candidate dedup rule (per problem and device), results round trip, WAL mode."""
import json
import sqlite3

import pytest

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate.result import Baseline, Result, Status, Timing
from kernelevolve.problem import Problem, source_sha
from kernelevolve.store import Store, StoreError
from tests.factories import make_profile

SOURCE = "class Model: pass\n"
PROBLEM = Problem(path="/tmp/p.py", source=SOURCE, sha=source_sha(SOURCE), name="p")
KEY = "cpu:x86_64:test"
CFG = {"device": "cpu", "max_evals": 3}
VERSIONS = {"torch": "2.x"}


def _ok(ms: float) -> Result:
    return Result(Status.OK, "verified", timing=Timing.from_samples([ms, ms * 1.1, ms * 0.9], "perf_counter"),
                  timed=True, load_s=0.1, compile_s=0.2, wall_s=1.5, details={"kernels": 2})


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "sub" / "ke.db")
    yield s
    s.close()


def test_create_run_and_read_back(store):
    run_id = store.create_run(PROBLEM, "cpu", KEY, CFG, VERSIONS)
    run = store.run(run_id)
    assert run.id == run_id and run.problem_sha == PROBLEM.sha
    assert run.device == "cpu" and run.device_key == KEY and run.status == "running"
    assert run.config == CFG and run.versions == VERSIONS
    assert run.profile is None and run.baseline is None
    assert store.problem_source(PROBLEM.sha).source == SOURCE
    store.update_run(run_id, status="finished", stop_reason="done")
    assert store.run(str(run_id)).stop_reason == "done"
    with pytest.raises(StoreError):
        store.update_run(run_id, created="2026-01-01")
    store.update_run(run_id, config={**CFG, "proposer_options": {"max_calls": 200}})  # a resume's new budget
    assert store.run(run_id).config["proposer_options"] == {"max_calls": 200}


def test_profile_and_baseline_are_typed_and_stored_as_the_json_earlier_versions_wrote(store):
    run_id = store.create_run(PROBLEM, "cpu", KEY, CFG, VERSIONS)
    profile = make_profile(dtype="bfloat16", bytes=3 * 2**20, notes=["memory bound"],
                           top_ops=[{"name": "aten::mm", "self_ms": 1.0, "pct": 90.0, "calls": 1}])
    baseline = Baseline("cpu", eager=Timing.from_samples([2.0, 3.0], "perf_counter"), compiled=None, compile_s=1.5)
    store.update_run(run_id, profile=profile, baseline=baseline, phases={"profile_s": 0.5})
    run = store.run(run_id)
    assert run.profile == profile and run.baseline == baseline and run.phases == {"profile_s": 0.5}
    raw = store.db.execute("SELECT profile, baseline FROM runs WHERE id = ?", (run_id,)).fetchone()
    assert json.loads(raw[0]) == profile.to_dict() and raw[1] == baseline.to_json()  # older stores load the same
    store.db.execute("UPDATE runs SET phases = NULL, versions = NULL WHERE id = ?", (run_id,))
    store.db.commit()
    assert store.run(run_id).phases == {} and store.run(run_id).versions == {}  # not recorded


def test_run_latest_and_listing(store):
    first = store.create_run(PROBLEM, "cpu", KEY, CFG, VERSIONS)
    second = store.create_run(PROBLEM, "cpu", KEY, CFG, VERSIONS)  # same problem: one problems row
    assert store.run("latest").id == second > first
    assert [r.id for r in store.runs()] == [first, second]
    assert store.runs()[0].name == "p" and store.runs()[0].n_nodes == 0


@pytest.mark.parametrize("bad", [999, "999", "nope", "latest"])
def test_unknown_run_raises(tmp_path, bad):
    s = Store(tmp_path / "empty.db")
    if bad != "latest":
        s.create_run(PROBLEM, "cpu", KEY, CFG, VERSIONS)
    with pytest.raises(StoreError, match="no run"):
        s.run(bad)
    s.close()


def test_unknown_problem_raises(store):
    with pytest.raises(StoreError):
        store.problem_source("0" * 64)


def test_add_node_dedup_per_problem_and_device(store):
    run_id = store.create_run(PROBLEM, "cpu", KEY, CFG, VERSIONS)
    cand = Candidate("class ModelNew: pass\n", proposer="manual")
    n1 = store.add_node(run_id, PROBLEM.sha, KEY, cand)
    assert n1.cached is False and n1.result is None
    store.save_result(n1.id, _ok(2.0))

    run2 = store.create_run(PROBLEM, "cpu", KEY, CFG, VERSIONS)
    n2 = store.add_node(run2, PROBLEM.sha, KEY, cand)
    assert n2.cached is True and n2.id != n1.id
    node = store.nodes(run2)[0]
    assert node.cached is True and node.result.runtime_ms == pytest.approx(2.0)
    assert n2 == node  # add_node returns the node as the store reads it back, the reused result included

    assert store.add_node(run2, PROBLEM.sha, "cuda:H200", cand).cached is False  # another device: no carry-over
    assert store.add_node(run2, "f" * 64, KEY, cand).cached is False  # another problem
    assert store.add_node(run2, PROBLEM.sha, KEY, Candidate("class ModelNew: x = 1\n")).cached is False  # source
    assert store.db.execute("SELECT COUNT(*) FROM candidates").fetchone()[0] == 4


def test_not_cached_until_a_result_is_saved(store):
    run_id = store.create_run(PROBLEM, "cpu", KEY, CFG, VERSIONS)
    cand = Candidate("class ModelNew: pass\n")
    c1 = store.add_node(run_id, PROBLEM.sha, KEY, cand).cached
    run2 = store.create_run(PROBLEM, "cpu", KEY, CFG, VERSIONS)
    c2 = store.add_node(run2, PROBLEM.sha, KEY, cand).cached
    assert (c1, c2) == (False, False)
    assert store.nodes(run_id)[0].result is None


def test_nodes_round_trip(store):
    run_id = store.create_run(PROBLEM, "cpu", KEY, CFG, VERSIONS)
    root = Candidate("import torch\nx = torch.compile(f)\n", proposer="inductor", meta={"options": {"a": 1}})
    added = [store.add_node(run_id, PROBLEM.sha, KEY, root)]
    n1 = added[0].id
    child = Candidate("@triton.jit\ndef k(): pass\n", proposer="template", parent=n1, meta={"why": "tile"})
    added.append(store.add_node(run_id, PROBLEM.sha, KEY, child))
    n2 = added[1].id
    assert store.nodes(run_id) == added  # as added: pending
    r1 = _ok(3.0)
    r2 = Result(Status.INCORRECT, "max abs error 1.0 at [0, 3]", error="mismatch details")
    store.save_result(n1, r1)
    store.save_result(n2, r2)

    nodes = store.nodes(run_id)
    assert [n.id for n in nodes] == [n1, n2]
    a, b = nodes
    assert a.parent is None and b.parent == n1
    assert a.proposer == "inductor" and a.language == "inductor" and b.language == "triton"
    assert a.meta == {"options": {"a": 1}} and b.meta == {"why": "tile"}
    assert a.sha == root.sha and a.source == root.source
    assert a.cached is False
    assert a.result == r1 and b.result == r2
    assert a.result.timing == r1.timing and a.result.details == {"kernels": 2}
    assert Result.from_dict(r1.to_dict()) == r1
    assert store.runs()[0].n_nodes == 2


def test_count_evaluated_skips_pending_and_cached(store):
    run_id = store.create_run(PROBLEM, "cpu", KEY, CFG, VERSIONS)
    assert store.count_evaluated(run_id) == 0
    a = store.add_node(run_id, PROBLEM.sha, KEY, Candidate("a = 1\n")).id
    store.add_node(run_id, PROBLEM.sha, KEY, Candidate("b = 2\n"))  # pending
    store.save_result(a, _ok(1.0))
    assert store.count_evaluated(run_id) == 1

    run2 = store.create_run(PROBLEM, "cpu", KEY, CFG, VERSIONS)
    store.add_node(run2, PROBLEM.sha, KEY, Candidate("a = 1\n"))  # cached from run 1
    assert store.count_evaluated(run2) == 0
    assert store.count_evaluated(run_id) == 1


def test_save_result_replaces(store):
    run_id = store.create_run(PROBLEM, "cpu", KEY, CFG, VERSIONS)
    n = store.add_node(run_id, PROBLEM.sha, KEY, Candidate("a = 1\n")).id
    store.save_result(n, Result(Status.TIMEOUT, "too slow"))
    store.save_result(n, _ok(1.0))
    assert store.nodes(run_id)[0].result.ok


def test_wal_mode_and_committed_for_other_connections(store):
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
    run_id = store.create_run(PROBLEM, "cpu", KEY, CFG, VERSIONS)
    n = store.add_node(run_id, PROBLEM.sha, KEY, Candidate("a = 1\n")).id
    store.save_result(n, _ok(1.0))
    other = sqlite3.connect(str(store.path))  # what another process (or a resumed run after kill -9) sees
    try:
        assert other.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
        assert other.execute("SELECT status FROM results").fetchall() == [("ok",)]
    finally:
        other.close()


def test_reopen_keeps_data(tmp_path):
    s = Store(tmp_path / "ke.db")
    run_id = s.create_run(PROBLEM, "cpu", KEY, CFG, VERSIONS)
    s.close()
    s = Store(tmp_path / "ke.db")
    assert s.run("latest").id == run_id
    s.close()


def test_experience_records_the_fastest_node_of_each_run_and_proposer(store):
    for run_ms in ((3.0, 1.0), (2.0, 5.0)):
        run = store.create_run(PROBLEM, "cpu", KEY, CFG, VERSIONS)
        store.update_run(run, profile=make_profile(dtype="bfloat16", bytes=3 * 2**20))
        for i, ms in enumerate(run_ms):
            meta = {"configs": [{"family": "pointwise", "config": {"BLOCK": 256 * (i + 1)}}], "ms": ms,
                    "label": f"c{i}"}
            node = store.add_node(run, PROBLEM.sha, KEY, Candidate(f"# {run} {i}\n", proposer="template",
                                                                    meta=meta))
            store.save_result(node.id, _ok(ms))
        node = store.add_node(run, PROBLEM.sha, KEY, Candidate(f"# {run} llm\n", proposer="llm",
                                                                meta={"strategy": "repair", "families": ["matmul"]}))
        store.save_result(node.id, _ok(9.0))
        assert store.record_experience(run) == 2  # one row per proposer
        assert store.record_experience(run) == 2  # recording again replaces
    current = store.create_run(PROBLEM, "cpu", KEY, CFG, VERSIONS)
    got = store.experience(KEY, "template", exclude_run=current)
    assert [e.meta["ms"] for e in got] == [1.0, 2.0]  # each run's fastest, fastest runs first
    e = got[0]
    assert e.source.endswith(" 1\n") and e.problem == PROBLEM.name and e.strategy == "c1"
    assert e.families == ["matmul", "pointwise"] and e.dtype == "bfloat16" and e.size_bucket == 22
    assert [x.proposer for x in store.experience(KEY, None)] == ["template", "template", "llm", "llm"]
    assert store.experience(KEY, "llm")[0].strategy == "repair"
    assert store.experience("cuda:other", "template") == []
    assert store.experience(KEY, "inductor") == []


def test_experience_is_backfilled_for_older_databases(tmp_path):
    s = Store(tmp_path / "ke.db")
    run = s.create_run(PROBLEM, "cpu", KEY, CFG, VERSIONS)
    node = s.add_node(run, PROBLEM.sha, KEY, Candidate("# a\n", proposer="template", meta={}))
    s.save_result(node.id, _ok(2.0))
    s.update_run(run, status="finished")
    s.db.execute("DELETE FROM experience")  # as written before the table existed
    s.db.commit()
    s.close()
    s = Store(tmp_path / "ke.db")
    assert [e.ms for e in s.experience(KEY, None)] == [2.0]
    s.close()