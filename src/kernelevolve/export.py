"""From a verified candidate to production: verification on many shapes, approval, and a standalone module.

- ``verify_shapes``: the candidate through the whole harness on every shape the problem declares and on shapes derived
  from the first one (half, double and one-less of the batch-like leading dimension). Each gets a verdict: ``wins``,
  ``ties`` or ``loses`` against eager, ``untimed`` when timings would be meaningless, ``fallback`` when the candidate
  was right only through its own reference path, ``wrong`` or ``error``.
- ``approve``: records who approved which candidate (by its source hash), when and why. A changed source voids it.
- ``export``: a module that needs only torch (and triton when the kernel uses it), with a ``torch.library.custom_op``
  (and its fake implementation, so torch.compile and torch.export trace through), a guarded ``ModelNew`` that runs the
  op only on the devices, dtypes and shapes it was verified on, provenance in its docstring, and a pytest file beside
  it that checks the module against the reference.
"""
from __future__ import annotations

import datetime as dt
import getpass
import hashlib
import json
import os
import pprint
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kernelevolve.candidate import Candidate
from kernelevolve.frames import fill
from kernelevolve.problem import Problem, build_model, import_module_from_path, load_problem, make_inputs
from kernelevolve.rows import Approval, Node, Run, best_node
from kernelevolve.store import Store

WIN, TIE = 1.05, 0.95  # speedup over eager above which a shape wins, below which it loses
VERDICTS = ("wins", "ties", "loses", "untimed", "fallback", "wrong", "error")


class ExportError(Exception):
    pass


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# --- shapes -----------------------------------------------------------------------------------------------------------
def leading_dim(values: list[Any]) -> int | None:
    """The most common leading size among the tensor inputs (the batch-like dimension), if any is above 1."""
    sizes = Counter(v.shape[0] for v in values if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] > 1)
    return sizes.most_common(1)[0][0] if sizes else None


def shape_key(values: list[Any]) -> list[list[Any]]:
    """What the guard compares: each input's shape and dtype (or a scalar's value)."""
    return [[list(v.shape), str(v.dtype).removeprefix("torch.")] if isinstance(v, torch.Tensor) else ["scalar", v]
            for v in values]


@dataclass(frozen=True)
class ShapeCase:
    label: str
    path: Path  # a problem file whose first input set is this shape
    shape_index: int = 0


def shape_cases(problem: Problem, workdir: Path) -> list[ShapeCase]:
    """Every declared shape, then the shapes derived from the first: half, double and one less of its batch-like
    leading dimension."""
    workdir.mkdir(parents=True, exist_ok=True)
    cases = [ShapeCase("declared 0" if problem.n_shapes > 1 else "declared", Path(problem.path))]
    cases += [ShapeCase(f"declared {i}", Path(problem.path), i) for i in range(1, problem.n_shapes)]
    module = import_module_from_path(problem.path, f"_ke_export_{problem.short_sha}")
    old = leading_dim(make_inputs(module, 0))
    if old is None:
        return cases
    for label, new in (("half batch", max(1, old // 2)), ("double batch", old * 2), ("odd batch", old - 1)):
        if new in (old, 0) or any(c.label.endswith(f"({new})") for c in cases):
            continue
        path = workdir / f"{Path(problem.path).stem}__{new}.py"
        path.write_text(problem.source.rstrip() + "\n" + fill("derived_inputs.py.tmpl", old=old, new=new))
        cases.append(ShapeCase(f"{label} ({new})", path))
    return cases


def _verdict(result: Any) -> str:
    """``fallback``: correct on every trial, but through the candidate's own reference path (its kernels did not run
    on this shape), so the export leaves this shape to the reference."""
    if result.status.value == "rejected" and "launched none" in result.reason:
        return "fallback"
    if result.status.value != "ok":
        return "wrong" if result.status.value in ("incorrect", "rejected") else "error"
    if not result.timed or result.speedup_eager is None:
        return "untimed"
    return "wins" if result.speedup_eager >= WIN else "ties" if result.speedup_eager > TIE else "loses"


def verify_shapes(problem: Problem, source: str, device: str, workdir: Path, timeout_s: float = 600.0,
                  timing_budget_ms: float = 300.0, on_case=lambda case, row: None) -> list[dict[str, Any]]:
    """The candidate judged and timed by the harness on every shape case, each against its own eager baseline."""
    from kernelevolve.evaluate import EvalConfig, Evaluator, TimingConfig

    cfg = EvalConfig(device=device, timeout_s=timeout_s, timing=TimingConfig(budget_ms=timing_budget_ms))
    rows = []
    for case in shape_cases(problem, workdir / "shapes"):
        row: dict[str, Any] = {"label": case.label}
        try:
            p = load_problem(case.path, device)
            module = import_module_from_path(case.path, f"_ke_case_{p.short_sha}_{case.shape_index}")
            row["inputs"] = shape_key(make_inputs(module, 0, case.shape_index))
            evaluator = Evaluator(p, cfg, workdir / "eval" / re.sub(r"\W+", "_", case.label))
            result = evaluator.evaluate(Candidate(source)).with_baseline(evaluator.baseline(compiled=False))
            row.update(verdict=_verdict(result), status=result.status.value, reason=result.reason,
                       speedup=result.speedup_eager, runtime_ms=result.runtime_ms)
            if case.shape_index and row["verdict"] in ("wins", "ties", "loses", "untimed"):
                row["note"] = "timed on the first shape only" if row["verdict"] != "untimed" else ""
        except Exception as e:  # a derived shape the reference itself cannot take is not the candidate's failure
            row.update(verdict="error", status="error", reason=f"{type(e).__name__}: {e}"[:300], speedup=None)
        rows.append(row)
        on_case(case, row)
    return rows


# --- approval ---------------------------------------------------------------------------------------------------------
def resolve(store: Store, run: str | int, candidate: int | None) -> Node:
    """The node to export: ``candidate`` (a node id of the run), or the run's best verified node where the run
    answered with it (not where its head-to-head found it no faster than a baseline)."""
    run_id = store.run(run).id
    nodes = store.nodes(run_id)
    if candidate is not None:
        node = next((n for n in nodes if n.id == candidate), None)
        if node is None:
            raise ExportError(f"run {run_id} has no node {candidate}; see kernelevolve show {run_id}")
    else:
        node, _ = best_node(nodes)
        if node is None:
            raise ExportError(f"run {run_id} has no verified candidate to export")
        h2h = store.run(run_id).head_to_head
        if h2h is not None and h2h.answer and not h2h.wins:
            raise ExportError(f"run {run_id} answered with a baseline's kernel, not a candidate ({h2h.line()}); "
                              f"--candidate {node.id} exports its winner all the same")
    if node.result is None or not node.result.ok:
        state = node.result.status.value if node.result else "not evaluated"
        raise ExportError(f"node {node.id} is not verified ({state})")
    return node


def approve(store: Store, run: str | int, candidate: int | None, note: str, by: str | None = None) -> Approval:
    node = resolve(store, run, candidate)
    return store.add_approval(node.run_id, node.id, sha256(node.source), by or _user(), note)


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user database entry (some containers)
        return os.environ.get("USER", "unknown")


def check_approval(store: Store, node: Node) -> Approval:
    """The approval that covers this node's current source; ExportError when there is none or it is void."""
    approvals = store.approvals(node.run_id, node.id)
    if not approvals:
        raise ExportError(f"node {node.id} of run {node.run_id} is not approved: run kernelevolve approve "
                          f"{node.run_id} --candidate {node.id} --note TEXT (or export with --auto-approve)")
    current = sha256(node.source)
    valid = [a for a in approvals if a.candidate_sha == current]
    if not valid:
        raise ExportError(f"the approval of node {node.id} is void: its source changed after approval "
                          f"(approved {approvals[-1].candidate_sha[:12]}, now {current[:12]})")
    return valid[-1]


# --- the exported module ----------------------------------------------------------------------------------------------
def _literal(text: str) -> str:
    """A readable Python literal for a source file: a raw triple-quoted string where that is exact, else repr."""
    quotes = "'" * 3
    if quotes in text or text.endswith(("\\", "'")):
        return repr(text)
    return f"r{quotes}{text}{quotes}"


def _provenance(export: dict[str, Any], problem: Problem, origin: str) -> str:
    approved = export["approved"]
    lines = [f"Problem: {problem.name} (sha256 {export['problem_sha'][:16]}), from {origin}",
             f"Device: {export['device_name']} ({export['device']}"
             + (f", capability {export['capability'][0]}.{export['capability'][1]})" if export["capability"] else ")"),
             f"Versions: kernelevolve {export['versions'].get('kernelevolve')}, torch {export['versions'].get('torch')}, "
             f"triton {export['versions'].get('triton')}; exported {export['created']}",
             f"Kernel: node {export['node']} of run {export['run']} ({export['proposer']}: {export['label']}), "
             f"source sha256 {export['candidate_sha'][:16]}",
             f"Approved by {approved['by']} at {approved['at']}: {approved['note']}",
             f"Dispatch: the kernel runs on the shapes marked {' or '.join(export['dispatch'])} below; everything "
             "else runs the reference.", "", "Measured by the kernelevolve harness, against eager on each shape:"]
    for row in export["shapes"]:
        speed = f"{row['speedup']:.2f}x" if row.get("speedup") else "—"
        inputs = ", ".join(f"{d}{s}" if s != "scalar" else repr(d) for s, d in row["inputs"]) if row.get("inputs") \
            else "—"
        lines.append(f"  {row['label']:<22} {row['verdict']:<8} {speed:>8}  {inputs}"[:200])
    return "\n".join(lines)


def op_name(problem: Problem, candidate_sha: str) -> str:
    return re.sub(r"\W+", "_", f"{problem.name}_{candidate_sha[:12]}").strip("_").lower()


def build_export(store: Store, run: str | int, candidate: int | None, out: Path, shapes: list[dict[str, Any]],
                 approval: Approval, dispatch: tuple[str, ...] = ("wins",),
                 aoti: bool = False) -> tuple[Path, Path]:
    """Write the module and its test file (and, with ``aoti``, an AOTInductor package beside them); return the
    module's and the test's paths."""
    from kernelevolve.machine import versions

    node = resolve(store, run, candidate)
    run_row = store.run(node.run_id)
    problem = stored_problem(store, run_row, out.parent / f".{out.stem}-work")
    origin = store.problem_source(run_row.problem_sha).path
    module = import_module_from_path(problem.path, f"_ke_export_ref_{problem.short_sha}")
    init = list(module.get_init_inputs())
    model, outputs = _trace_on_meta(module)
    state = [[n, list(t.shape), str(t.dtype).removeprefix("torch.")] for n, t in
             [*model.named_parameters(), *model.named_buffers()]]
    device = run_row.device
    capability = None
    if device == "cuda" and torch.cuda.is_available():
        capability = list(torch.cuda.get_device_capability(0))
    sha = sha256(node.source)
    export = {"name": op_name(problem, sha), "problem_sha": problem.sha, "problem_name": problem.name,
              "signature": _signature(problem.source), "device": device,
              "device_name": run_row.device_key.split(":", 1)[-1], "capability": capability,
              "candidate_sha": sha, "run": run_row.id, "node": node.id, "proposer": node.proposer,
              "label": node.label,
              "approved": {"by": approval.approved_by, "at": approval.created, "note": approval.note},
              "init_inputs": init, "state": state, "single_output": isinstance(outputs, torch.Tensor),
              "training": bool(model.training), "mutated_state": list(problem.mutated_state),
              "shapes": shapes, "dispatch": list(dispatch),
              "speedup": shapes[0].get("speedup") if shapes else None,
              "versions": versions(), "created": dt.date.today().isoformat(), "aoti_package": None}
    if aoti:
        out.parent.mkdir(parents=True, exist_ok=True)
        export["aoti_package"] = build_aoti(problem, node, device, out.with_suffix(".pt2")).name
    try:
        json.dumps(export)
    except TypeError as e:
        raise ExportError(f"the constructor arguments of {problem.name} cannot be written as plain data: {e}") from e
    title = f"kernelevolve export: {problem.name} on {export['device_name']}."
    text = fill("export_module.py.tmpl", title=title, provenance=_provenance(export, problem, origin),
                         export=pprint.pformat(export, width=116, sort_dicts=False), reference=_literal(problem.source),
                         kernel=_literal(node.source), op=export["name"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    test = out.with_name(f"test_{out.stem}.py")
    test.write_text(fill("export_test.py.tmpl", module=out.stem))
    return out, test


def _trace_on_meta(module: Any) -> tuple[torch.nn.Module, Any]:
    """The reference model and its output for the first input set, on the meta device where it can be (shapes and
    dtypes only: a full-size reference costs nothing), else for real."""
    try:
        with torch.device("meta"), torch.no_grad():
            model = module.Model(*module.get_init_inputs())
            return model, model(*module.get_inputs())
    except Exception:  # an op without a meta kernel, or .item() on an input
        model = build_model(module, "Model", 0)
        with torch.no_grad():
            return model, model(*make_inputs(module, 0))


def stored_problem(store: Store, run: Run, workdir: Path) -> Problem:
    """The problem exactly as the run saw it, from the store (the file may have moved or changed since)."""
    row = store.problem_source(run.problem_sha)
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"{row.name}.py"
    path.write_text(row.source)
    return load_problem(path, "cpu")


def build_aoti(problem: Problem, node: Node, device: str, path: Path) -> Path:
    """An AOTInductor package of the reference, compiled with an Inductor candidate's options, for its first input
    shapes (weights can be swapped in at load time)."""
    import torch._inductor

    if node.proposer != "inductor":
        raise ExportError(f"--aoti is for Inductor candidates; node {node.id} comes from {node.proposer}")
    module = import_module_from_path(problem.path, f"_ke_aoti_{problem.short_sha}")
    model = build_model(module, "Model", 0).to(device)  # in its constructed mode, as it was judged
    inputs = tuple(v.to(device) if isinstance(v, torch.Tensor) else v for v in make_inputs(module, 0))
    options = {k: v for k, v in (node.meta.get("options") or {}).items() if k != "triton.cudagraphs"}
    with torch.no_grad():
        program = torch.export.export(model, inputs)
    return Path(torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs=options))


def _signature(source: str) -> str:
    """The problem's signature for the registry (its Model class, independent of the class name)."""
    try:
        from kernelevolve.registry import problem_signature

        return problem_signature(source)
    except Exception:  # the registry is optional for a plain export
        return ""


__all__ = ["ExportError", "ShapeCase", "TIE", "VERDICTS", "WIN", "approve", "build_aoti",
           "build_export", "check_approval", "leading_dim", "op_name", "resolve", "shape_cases", "shape_key", "sha256",
           "stored_problem", "verify_shapes"]
