"""Store rows and profiles built by hand, for tests that only care about a few of their fields."""
from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

from kernelevolve.candidate import Meta
from kernelevolve.evaluate.result import Result
from kernelevolve.profile import Profile
from kernelevolve.rows import Experience, Node

PROFILE = Profile(device="cpu", device_name="test CPU", flops=0, bytes=0, dtype="float32", peak_flops=1e12,
                  peak_bw=1e11, ceilings_source="measured", floor_ms=0.0, intensity=0.0, ridge=10.0, bound="memory",
                  eager_ms=1.0, top_ops=[], notes=[])


def make_profile(**fields: Any) -> Profile:
    return replace(PROFILE, **fields)


def make_node(id: int, result: Result | None = None, parent: int | None = None, proposer: str = "template",
              meta: Meta | None = None, source: str | None = None, **fields: Any) -> Node:
    source = f"# node {id}\n" if source is None else source
    values: dict[str, Any] = dict(
        id=id, run_id=1, parent=parent, proposer=proposer, meta=meta if meta is not None else {}, cached=False,
        created="2025-01-01T00:00:00", candidate_id=id, sha=hashlib.sha256(source.encode()).hexdigest(),
        source=source, language="triton", result=result)
    values.update(fields)
    return Node(**values)


def make_experience(proposer: str = "template", meta: Meta | None = None, dtype: str | None = "float32",
                    nbytes: float | None = 1e6, speedup: float | None = 1.5, source: str = "# kernel\n",
                    problem: str = "other", families: list[str] | None = None) -> Experience:
    return Experience(run_id=1, proposer=proposer, strategy=None, meta=meta or {}, ms=1.0, speedup_eager=speedup,
                      problem_sha="0" * 64, problem=problem, families=families or [], dtype=dtype, bytes=nbytes,
                      size_bucket=None, source=source)
