"""A whole model's report: where its time went before and after (a waterfall), each problem's kernel, verdict and
speedup, and the end-to-end figures; ``model_report.html`` beside best_model.py.

Before and after are measured alike, in one harness: best_model.py's generated forward, and the same forward with
each kept region running its own ops instead of its kernel, each call in a profiler range (device time on a GPU,
CPU time on the CPU) and each region's calls in a range of their own. The rest of the model is the whole less the
kept problems. The end-to-end speedups are the head-to-head's (call latency, the user's clock).
"""
from __future__ import annotations

import html
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

REST = "the rest of the model"
WHOLE_ROW = "the whole model"


@dataclass(frozen=True)
class Step:
    """A row of the waterfall: a kept problem, the rest of the model, or the whole."""
    name: str
    where: str
    before_ms: float
    after_ms: float | None

    @property
    def saved_ms(self) -> float | None:
        return None if self.after_ms is None else self.before_ms - self.after_ms


def waterfall(outcome: Any) -> tuple[list[Step], str]:
    """The rows, and a note where the times could not be measured (then the after column is empty)."""
    from kernelevolve.model.compose import Chosen, compose
    from kernelevolve.model.profile import WHOLE, composed_times

    plan = outcome.plan
    if plan is None:
        return _parts_waterfall(outcome)
    kept = [g for g in plan.groups if g.name in outcome.kept]
    region_of = {f"_ke_{r.name}": g.name for g in kept for r in g.regions}
    before, after, note = {}, {}, ""
    if outcome.best_model is not None:
        try:
            after = composed_times(outcome.best_model, region_of, plan.times.device)
            if kept:
                # the same generated forward with each kept region running its own ops: before and after differ
                # only in the region kernels
                own = [Chosen(g.name, g.regions, g.path.read_text() + "\n\nclass ModelNew(Model):\n    pass\n",
                              "the region's own ops") for g in kept]
                text, _ = compose(plan.problem.source, plan.graph, own, "the model with each region as its own ops")
                path = plan.out_dir / ".work" / "model_before.py"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                before = composed_times(path, region_of, plan.times.device)
            else:  # best_model.py is the model or a compiled build of it: before is the model's own class there
                before = composed_times(outcome.best_model, {}, plan.times.device, cls="Model")
        except Exception as e:  # a report without its measured columns, never a failed run
            log.warning("the model could not be profiled region by region: %s: %s", type(e).__name__, e)
            note = f"the model could not be profiled region by region: {type(e).__name__}: {str(e)[:200]}"
            before, after = {}, {}
    rows = []
    for g in kept:
        where = g.regions[0].where + (f" (x{len(g.regions)})" if len(g.regions) > 1 else "")
        rows.append(Step(g.name, where, before.get(g.name, g.ms), after.get(g.name, 0.0) if after else None))
    before_total = before.get(WHOLE, plan.times.total_ms)
    after_total = after.get(WHOLE)
    rest_after = None if after_total is None else after_total - sum(s.after_ms or 0.0 for s in rows)
    rows.append(Step(REST, f"{len(plan.groups) - len(kept)} problems left to the model's own ops, and the glue",
                     before_total - sum(s.before_ms for s in rows), rest_after))
    rows.append(Step(WHOLE_ROW, plan.times.device, before_total, after_total))
    return rows, note


def _parts_waterfall(outcome: Any) -> tuple[list[Step], str]:
    """By parts: the model and best_model.py's ModelNew timed alike, each kept part's instances in ranges of their
    own (hooks on the module paths), the rest of the model the whole less them."""
    from kernelevolve.model.profile import WHOLE, part_times
    from kernelevolve.problem import build_model, import_module_from_path, make_inputs

    kept = [r for r in outcome.parts if r["name"] in outcome.kept]
    paths = [p for r in kept for p in r["paths"]]
    before: dict[str, float] = {}
    after: dict[str, float] = {}
    note = ""
    if outcome.best_model is not None:
        try:
            module = import_module_from_path(outcome.best_model, f"_kernelevolve_parts_report_{id(outcome)}")
            inputs = make_inputs(module, 0, device=outcome.device)
            before = part_times(build_model(module, "Model", 0).to(outcome.device), inputs, paths, outcome.device)
            if kept:
                after = part_times(build_model(module, "ModelNew", 0).to(outcome.device), inputs, paths,
                                   outcome.device)
        except Exception as e:  # a report without its measured columns, never a failed run
            note = f"the model could not be profiled part by part: {type(e).__name__}: {str(e)[:200]}"
            before, after = {}, {}
    rows = [Step(r["name"], ", ".join(r["paths"])[:80], sum(before.get(p, 0.0) for p in r["paths"]) if before
                 else r["ms"], sum(after.get(p, 0.0) for p in r["paths"]) if after else None) for r in kept]
    before_total = before.get(WHOLE, sum(r["ms"] for r in outcome.parts))
    after_total = after.get(WHOLE) if after else None
    rows.append(Step(REST, "the parts left to the model's own code, and the code between the parts",
                     before_total - sum(s.before_ms for s in rows),
                     None if after_total is None else after_total - sum(s.after_ms or 0.0 for s in rows)))
    rows.append(Step(WHOLE_ROW, outcome.device, before_total, after_total))
    return rows, note


def waterfall_lines(steps: list[Step]) -> list[str]:
    """The waterfall as text: one line a row."""
    lines = [f"{'':<24} {'before ms':>10} {'after ms':>10} {'saved':>9}"]
    for s in steps:
        after = "—" if s.after_ms is None else f"{s.after_ms:.4f}"
        saved = "—" if s.saved_ms is None else f"{s.saved_ms:+.4f}"
        lines.append(f"{s.name[:24]:<24} {s.before_ms:>10.4f} {after:>10} {saved:>9}")
    return lines


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def _svg(steps: list[Step], width: int = 760) -> str:
    """Each row's before (grey) and after (green) as bars on one scale, the values written beside them."""
    top = max([s.before_ms for s in steps] + [s.after_ms or 0.0 for s in steps] + [1e-9])
    label_w, bar_w, row_h = 200, width - 200 - 90, 34
    parts = [f'<svg width="{width}" height="{row_h * len(steps) + 24}" role="img" '
             f'aria-label="time by region, before and after">']
    for i, s in enumerate(steps):
        y = 6 + i * row_h
        parts.append(f'<text x="0" y="{y + 18}">{_e(s.name[:30])}</text>')
        for j, (ms, color) in enumerate(((s.before_ms, "#8c959f"), (s.after_ms, "#1a7f37"))):
            if ms is None:
                continue
            w = max(1.0, bar_w * ms / top)
            parts.append(f'<rect x="{label_w}" y="{y + j * 13}" width="{w:.1f}" height="11" fill="{color}"/>'
                         f'<text x="{label_w + w + 4:.1f}" y="{y + j * 13 + 10}">{ms:.4g} ms</text>')
    axis_y = 6 + len(steps) * row_h
    parts.append(f'<line x1="{label_w}" y1="{axis_y}" x2="{label_w + bar_w}" y2="{axis_y}" stroke="#d0d7de"/>'
                 f'<text x="{label_w}" y="{axis_y + 14}">0</text>'
                 f'<text x="{label_w + bar_w - 40}" y="{axis_y + 14}">{top:.4g} ms</text></svg>')
    return "".join(parts)


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def ends_line(outcome: Any) -> str:
    """The answer's speedup over each build of the whole model; a build not timed again in the last head-to-head
    (headtohead.carried) is marked so."""
    h = outcome.head_to_head
    if h is None or not h.answer:
        return "not timed head to head"
    return ", ".join(f"{v:.2f}x vs {k}" + (" (carried over)" if "not timed again" in h.notes.get(k, "") else "")
                     for k, v in h.speedup.items())


def _steps_html(title: str, steps: list[Step], note: str) -> list[str]:
    return [f"<h2>{title}, before and after</h2>", _svg(steps),
            _table(["", "where", "before ms", "after ms", "saved ms"],
                   [[s.name, s.where, f"{s.before_ms:.4f}", "—" if s.after_ms is None else f"{s.after_ms:.4f}",
                     "—" if s.saved_ms is None else f"{s.saved_ms:+.4f}"] for s in steps]),
            f"<p class=meta>{_e(note)}</p>" if note else ""]


def _page(title: str, body: list[str], lists: list[tuple[str, list[str]]]) -> str:
    from kernelevolve.report import CSS

    for heading, items in lists:
        if items:
            body.append(f"<h2>{heading}</h2><ul>" + "".join(f"<li>{_e(d)}</li>" for d in items) + "</ul>")
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{_e(title)}</title><style>{CSS}</style>"
            f"</head><body>{''.join(body)}</body></html>")


def render(outcome: Any, steps: list[Step], note: str) -> str:
    plan = outcome.plan
    if plan is None:
        return _render_parts(outcome, steps, note)
    outcomes = {o.name: o for o in outcome.regions}
    problems = []
    for g in plan.groups:
        o = outcomes.get(g.name)
        problems.append([g.name, g.kind, g.regions[0].where, len(g.regions), f"{g.ms:.4f}",
                         f"{g.ms / plan.times.total_ms:.1%}" if plan.times.total_ms else "—",
                         f"{g.share.budget_s:.0f} s" if g.share and g.share.budget_s else (g.share.why if g.share
                                                                                           else ""),
                         o.run_id if o and o.run_id is not None else "—",
                         f"{o.speedup:.2f}x" if o and o.speedup else "—",
                         "kept" if g.name in outcome.kept else (o.why if o else "")])
    body = [f"<h1>{_e(plan.problem.name)}: the whole model</h1>",
            f'<p class="meta">device {_e(plan.times.device)} · model run {_e(outcome.run_id)} · '
            f"{len(plan.graph.calls())} ops, {len(plan.partition.regions)} regions, {len(plan.groups)} problems</p>",
            f"<p><b>best_model.py</b>: {_e(outcome.why)}</p><p><b>end to end</b>: {_e(ends_line(outcome))}</p>",
            *_steps_html("Time by region", steps, note), "<h2>Problems</h2>",
            _table(["problem", "kind", "where", "instances", "ms", "share", "budget", "run", "speedup",
                    "in best_model.py"], problems)]
    return _page(f"{plan.problem.name}: model report", body,
                 [("Dropped from the composition", outcome.dropped), ("Notes", plan.notes + outcome.notes)])


def _render_parts(outcome: Any, steps: list[Step], note: str) -> str:
    rows = [[r["name"], ", ".join(r["paths"])[:120], r["class"], f"{r['ms']:.4f}", f"{r['share']:.1%}",
             r.get("run_id") if r.get("run_id") is not None else "—",
             f"{r['speedup']:.2f}x" if r.get("speedup") else "—",
             "kept" if r["name"] in outcome.kept else r.get("why", "")] for r in outcome.parts]
    body = [f"<h1>{_e(outcome.out_dir.name if outcome.out_dir else 'model')}: the whole model, by its parts</h1>",
            f'<p class="meta">device {_e(outcome.device)} · model run {_e(outcome.run_id)}</p>',
            f"<p><b>best_model.py</b>: {_e(outcome.why)}</p><p><b>end to end</b>: {_e(ends_line(outcome))}</p>",
            *_steps_html("Time by part", steps, note), "<h2>Parts</h2><p>Each part's own report is in its folder.</p>",
            _table(["part", "instances", "class", "ms", "share", "run", "speedup", "in best_model.py"], rows)]
    return _page("model report", body, [("Dropped from the composition", outcome.dropped), ("Notes", outcome.notes)])


def write_model_report(outcome: Any) -> tuple[Path, list[Step], str]:
    """model_report.html in the run's folder; the waterfall's rows go into model_report.json too."""
    steps, note = waterfall(outcome)
    path = outcome.out_dir / "model_report.html"
    path.write_text(render(outcome, steps, note), encoding="utf-8")
    return path, steps, note


def steps_dicts(steps: list[Step]) -> list[dict[str, Any]]:
    return [asdict(s) for s in steps]
