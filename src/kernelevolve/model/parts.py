"""A model that cannot be captured as one graph, optimized by its parts that can.

Data-dependent Python (``.item()``, a branch on a tensor's value) stops the trace of the whole model. Its submodules
often trace on their own: from the top of the module tree down, each submodule the model calls is written as a
problem file of its own (``part_<path>.py``: the submodule, built as the model builds it, on the inputs the model gives
it) and captured; one that does not capture is looked into, child by child. Submodules alike (the same class, state
shapes and input shapes) are one part. Each part then runs as a whole model of its own (plan, regions, compose, judge)
with its share of the budget, and the model's ``best_model.py`` runs each part's ``best_model.py`` in place of the
part's forward at every instance, the model's own code everywhere else. That composition is judged as any.
"""
from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from kernelevolve.model.compose import EXEC, source_literal
from kernelevolve.problem import Problem, build_model, import_module_from_path, make_inputs

log = logging.getLogger(__name__)

PART = '''"""{doc}"""
import copy
import functools
import importlib.util
from pathlib import Path

import torch
import torch.nn as nn

PATH = {path!r}
@SOURCE_LOADER@


class Model(nn.Module):
    """The submodule at PATH, as the model builds it."""

    def __init__(self):
        super().__init__()
        self.part = copy.deepcopy(_source_model().get_submodule(PATH))

    def forward(self, *args):
        return type(self.part).forward(self.part, *args)


class _Reached(Exception):
    pass


def get_inputs():
    """The model's own inputs run through the model up to the part's first call: what the part gets there."""
    model = _source_model()
    got = []

    def take(module, args):
        got.append([a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args])
        raise _Reached

    handle = model.get_submodule(PATH).register_forward_pre_hook(take)
    try:
        with torch.no_grad():
            model(*_source().get_inputs())
    except _Reached:
        pass
    finally:
        handle.remove()
    return got[0]


def get_init_inputs():
    return []
'''

BINDER = '''

def _kernelevolve_bind_parts(model):
    """Each instance of each part runs its part's kernels: the part's ModelNew, holding the instance itself as its
    ``part``, in place of the instance's forward (a module of its own for each instance)."""
    for k, (paths, source) in enumerate(_KE_PARTS):
        for path in paths:
            sub = model.get_submodule(path)
            cls = _kernelevolve_exec(f"part {k} {path}", source).ModelNew
            wrapper = cls.__new__(cls)
            nn.Module.__init__(wrapper)
            wrapper.part = sub
            sub.forward = wrapper.forward
    model.__dict__["_ke_parts_bound"] = True


class ModelNew(Model):
    """@DOC@"""

    def forward(self, *args):
        if not self.__dict__.get("_ke_parts_bound"):
            _kernelevolve_bind_parts(self)
        return super().forward(*args)
'''


@dataclass
class Part:
    """Submodules alike, optimized once: the problem file of the first, the module paths of all."""
    paths: list[str]
    cls: str
    file: Path
    ms: float = 0.0  # all instances, one call of the model (eager, profiled)
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "p_" + re.sub(r"\W+", "_", self.paths[0]).strip("_")


def part_source(model_file: str, where: Path, path: str, doc: str) -> str:
    from kernelevolve.model.regionfile import SOURCE_LOADER

    return PART.replace("@SOURCE_LOADER@", SOURCE_LOADER).format(doc=doc, source=model_file, where=str(where),
                                                                   path=path, init_seed=0)


def _calls(model: nn.Module, inputs: list[Any]) -> dict[str, tuple[list[Any], bool]]:
    """Each submodule's first call in one run of the model: its positional arguments, and whether it took keyword
    arguments too."""
    seen: dict[str, tuple[list[Any], bool]] = {}
    handles = []
    for name, sub in model.named_modules():
        if not name:
            continue

        def take(module: nn.Module, args: tuple, kwargs: dict, name: str = name) -> None:
            seen.setdefault(name, ([_spec(a) for a in args], bool(kwargs)))
        handles.append(sub.register_forward_pre_hook(take, with_kwargs=True))
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return seen


def _spec(a: Any) -> Any:
    return (tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else repr(a)


def _state(sub: nn.Module) -> list[Any]:
    return [(k, tuple(v.shape), v.dtype) for k, v in [*sub.named_parameters(), *sub.named_buffers()]]


def find_parts(problem: Problem, out_dir: Path, device: str,
               on_stage: Callable[[str], None] = lambda s: None) -> tuple[list[Part], float, list[str]]:
    """The parts, the model's own time (ms, one call) and a line for each submodule that did not capture."""
    from kernelevolve.analyze.graph import CaptureError, capture
    from kernelevolve.model.profile import WHOLE, part_times
    from kernelevolve.problem import load_problem

    module = import_module_from_path(problem.path, f"_kernelevolve_parts_{problem.short_sha}")
    model = build_model(module, "Model", 0)
    inputs = make_inputs(module, 1)
    calls = _calls(model, inputs)
    source = Path(problem.path).name
    where = (out_dir / source).resolve()
    parts: list[Part] = []
    alike: dict[tuple, Part] = {}
    failed: set[tuple] = set()
    notes: list[str] = []
    frontier = [name for name, _ in model.named_children()]
    while frontier:
        path = frontier.pop(0)
        sub = model.get_submodule(path)
        children = [f"{path}.{c}" for c, _ in sub.named_children()]
        if path not in calls or calls[path][1]:  # not called as a module (a container), or called with keywords
            frontier = children + frontier
            continue
        key = (type(sub).__qualname__, tuple(_state(sub)), repr(calls[path][0]))
        if key in alike:
            alike[key].paths.append(path)
            continue
        if key in failed:
            frontier = children + frontier
            continue
        on_stage(f"capturing {path} ({type(sub).__name__}) on its own")
        part = Part([path], type(sub).__name__, out_dir / f"part_{re.sub(r'[^0-9A-Za-z]+', '_', path)}.py")
        part.file.write_text(part_source(source, where, path, f"Part {path} ({type(sub).__name__}) of {source}: "
                                                              "its forward on the inputs the model gives it."))
        try:
            capture(load_problem(part.file))
        except (CaptureError, Exception) as e:  # a part that does not trace: its children may
            at = getattr(e, "where", "") or ""
            notes.append(f"{path} ({type(sub).__name__}) could not be captured" + (f" (stopped at {at})" if at else ""))
            part.file.unlink(missing_ok=True)
            failed.add(key)
            frontier = children + frontier
            continue
        alike[key] = part
        parts.append(part)
    if parts:
        on_stage(f"timing {len(parts)} parts in the model on {device}")
        model = model.to(device)
        times = part_times(model, [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs],
                       [p for part in parts for p in part.paths], device)
        for part in parts:
            part.ms = sum(times.get(p, 0.0) for p in part.paths)
        total = times.get(WHOLE, sum(p.ms for p in parts))
    else:
        total = 0.0
    parts.sort(key=lambda p: -p.ms)
    return parts, total, notes


def compose_parts(model_source: str, chosen: list[tuple[Part, str, str]], doc: str) -> str:
    """best_model.py of the whole: the model verbatim, each chosen part's best_model.py (with where it came from)
    and a ModelNew that binds them to their instances on its first call."""
    entries = []
    for part, text, provenance in chosen:
        entries.append(f"    # {', '.join(part.paths)} ({part.cls}): {provenance}\n"
                       f"    ({part.paths!r}, {source_literal(text)}),")
    parts = [f'"""{doc}"""', "import torch\nimport torch.nn as nn",
             "# ---- the model, verbatim " + "-" * 86, model_source.rstrip(),
             "# ---- end of the model " + "-" * 89,
             "_KE_PARTS = [\n" + "\n".join(entries) + "\n]"]
    return "\n\n\n".join(parts) + "\n" + EXEC.strip("\n") + "\n" + BINDER.replace("@DOC@", doc.splitlines()[0])


def optimize_parts(path: str | Path, cfg: Any, store: Any, out_dir: Path, budget_s: float, min_share: float,
                   rivals: tuple[str, ...], on_stage: Callable[[str], None], hosts: tuple[str, ...] | None,
                   error: Exception, resume: bool = False, optimize_model: Callable[..., Any] | None = None) -> Any:
    """The model by its parts: each part that matters through optimize_model with its share of the budget, the
    parts that won composed into the model and judged as one candidate, a part that breaks the whole or leaves it
    no faster dropped (smallest gain first). ``optimize_model`` is run.optimize_model, which each part goes
    through (passed in: it is what calls this). Raises ``error`` (with why) where no submodule captures either."""
    import shutil
    from dataclasses import replace

    from kernelevolve.candidate import Candidate
    from kernelevolve.evaluate import Status
    from kernelevolve.model.plan import ModelError, RegionOutcome
    from kernelevolve.model.outcome import ModelOutcome, Record, fallback, finish, lost_line, settle_baselines
    from kernelevolve.optimize import make_evaluator
    from kernelevolve.problem import load_problem

    started = time.monotonic()
    problem = load_problem(path, cfg.device)
    on_stage(f"{error}")
    on_stage("looking for submodules that can be captured on their own")
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(problem.path, out_dir / Path(problem.path).name)
    parts, total, notes = find_parts(problem, out_dir, cfg.device, on_stage)
    if not parts:
        raise ModelError(f"{error}; no submodule of it can be captured on its own either") from error
    rows, outcomes, answers = [], {}, []
    big = [p for p in parts if total and p.ms / total >= min_share]
    weight = sum(p.ms for p in big) or 1.0  # of the parts not run yet
    for part in parts:
        share = part.ms / total if total else 0.0
        row = {"name": part.name, "paths": part.paths, "class": part.cls, "file": part.file.name, "ms": part.ms,
               "share": share}
        if part not in big:
            why = f"left alone: {share:.1%} of the model's time (under {min_share:.0%})"
            answers.append(RegionOutcome(part.name, None, None, None, why))
            rows.append(row | {"why": why})
            continue
        # what is left of the budget (each part's run judges its own whole too), shared by the parts still to run
        part_budget = max(budget_s - (time.monotonic() - started), 0.0) * part.ms / weight
        weight = max(weight - part.ms, 1e-9)
        on_stage(f"{part.name} ({part.cls} at {', '.join(part.paths)[:80]}): {part_budget:.0f} s")
        o = optimize_model(part.file, cfg, store, out_dir / part.name, part_budget, min_share, rivals,
                           lambda s, n=part.name: on_stage(f"{n}: {s}"), hosts=hosts, resume=resume)
        outcomes[part.name] = o
        h = o.head_to_head
        speedup = h.speedup.get(h.best_baseline) if h is not None and h.answer else None
        answer = "candidate" if o.kept and (h is None or h.wins) else (h.answer if h is not None else "")
        answers.append(RegionOutcome(part.name, o.run_id, o.best_model, speedup, o.why, answer))
        rows.append(row | {"run_id": o.run_id, "kept": o.kept, "speedup": speedup, "why": o.why,
                           "report": str(o.report) if o.report else None})
    result = ModelOutcome(None, answers, [], out_dir=out_dir, device=cfg.device, parts=rows,
                          notes=[f"the model as a whole: {error}"] + notes)
    record = Record(store, problem, out_dir, cfg, {a.name: a.run_id for a in answers})
    result.run_id = record.run_id
    chosen = [p for p in parts if p.name in outcomes and answers[[a.name for a in answers].index(p.name)].answer
              == "candidate"]
    gain = {a.name: (next(p for p in parts if p.name == a.name).ms * (1 - 1 / a.speedup) if a.speedup else 0.0)
            for a in answers}
    evaluator = make_evaluator(problem, replace(cfg, timeout_s=max(cfg.timeout_s, 600.0)), out_dir / ".work" / "model")
    doc = f"kernelevolve: {Path(problem.path).name} with its parts' kernels"
    try:
        while chosen:
            text = compose_parts(problem.source, [(p, outcomes[p.name].best_model.read_text(),
                                                   f"run {outcomes[p.name].run_id}: {outcomes[p.name].why}"[:200])
                                                  for p in chosen], doc)
            label = f"the model with {len(chosen)} parts' kernels ({', '.join(p.name for p in chosen)})"
            on_stage(f"judging {label}")
            candidate = Candidate(text, proposer="compose", meta={"label": label})
            verdict = evaluator.evaluate(candidate)
            if verdict.status is Status.OK and verdict.timed and cfg.head_to_head and result.baseline is None:
                result.baseline = record.baseline(evaluator)
            record.node(candidate, verdict, result.baseline)
            result.status = verdict.status.value
            worst = min(chosen, key=lambda p: gain.get(p.name, 0.0))
            if verdict.status is not Status.OK:
                result.dropped.append(f"{worst.name}: the composition was {verdict.status.value} "
                                      f"({verdict.reason[:120]})")
                chosen.remove(worst)
                continue
            if not cfg.head_to_head or cfg.device != "cuda" and not verdict.timed:
                result.why = f"the model with {len(chosen)} parts' kernels, verified (not timed on {cfg.device})"
                return finish(result, text, chosen, [], record)
            h = record.head_to_head(evaluator, candidate, rivals, result, on_stage, "it")
            if h.error:
                result.why = f"the model with {len(chosen)} parts' kernels, verified; the head-to-head could not " \
                             f"be held ({h.error[:160]})"
                result.head_to_head = None
                return finish(result, text, chosen, [], record)
            if h.wins:
                result.why = f"the model with {len(chosen)} parts' kernels; {h.line()}"
                return finish(result, text, chosen, [], record)
            result.dropped.append(lost_line(worst.name, h))
            chosen.remove(worst)
    except BaseException:
        store.update_run(record.run_id, status="interrupted", stop_reason="stopped while the model was judged")
        raise
    if cfg.head_to_head:
        settle_baselines(result, problem.source, record, evaluator, rivals, on_stage)
    return fallback(result, problem.source, record, "no part's kernels made the whole model faster")
