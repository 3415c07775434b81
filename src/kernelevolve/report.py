"""A run's outputs: the report's view of a run, read from the store alone; best.py (the best verified candidate, or
the reference itself, with the reason); and a self-contained HTML report (inline CSS and SVG only, so it views
offline)."""
from __future__ import annotations

import html
import math
import statistics
import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from kernelevolve.evaluate.headtohead import COMPILE_OPTIONS, LABELS, HeadToHead
from kernelevolve.candidate import compiled_source, diff_text
from kernelevolve.evaluate.result import Baseline, Result
from kernelevolve.roofline import counters_html, roofline_svg
from kernelevolve.rows import Node, best_node
from kernelevolve.spend import SpendLimits
from kernelevolve.store import Store

NONE = "—"
STATUS_COLORS = {
    "ok": "#1a7f37", "incorrect": "#bc4c00", "compile_error": "#cf222e", "runtime_error": "#cf222e",
    "timeout": "#8250df", "crashed": "#82071e", "rejected": "#6e7781",
}
CSS = """
body{font:14px/1.45 system-ui,sans-serif;color:#1f2328;background:#fff;margin:0 auto;max-width:1200px;padding:16px 24px}
h1{margin:0 0 4px}h2{border-bottom:1px solid #d0d7de;padding-bottom:4px;margin-top:28px}
.meta{color:#59636e}.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{border:1px solid #d0d7de;border-radius:6px;padding:8px 14px;background:#f6f8fa;min-width:110px}
.card b{display:block;font-size:20px}.card span{color:#59636e;font-size:12px}
table{border-collapse:collapse;margin:8px 0}
th,td{border-bottom:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa}td.num{text-align:right;font-variant-numeric:tabular-nums}
.badge{color:#fff;border-radius:10px;padding:1px 8px;font-size:12px;white-space:nowrap}
.untimed{background:#fff8c5;color:#7d4e00;border:1px solid #d4a72c}tr.untimed-row td{background:#fffdf0}
pre{background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px;padding:10px;overflow:auto;max-height:600px}
pre.err{background:#fff0f0;border-color:#ffc1c0}details summary{cursor:pointer;color:#0969da}
svg text{font:11px system-ui,sans-serif;fill:#59636e}
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _num(value: float | int | None, spec: str = ".4g", suffix: str = "") -> str:
    return NONE if value is None else f"{value:{spec}}{suffix}"


def _si(value: float | int | None, unit: str) -> str:
    if value is None:
        return NONE
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _x(value: float | None) -> str:
    return _num(value, ".2f", "x")


def _table(headers: list[str], rows: list[list[str]], num_cols: frozenset[int] = frozenset()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f'<td{" class=num" if i in num_cols else ""}>{c}</td>' for i, c in enumerate(r)) + "</tr>"
        for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _kv(pairs: list[tuple[str, str]]) -> str:
    return "<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in pairs) + "</table>"


def _badge(status: str | None) -> str:
    color = STATUS_COLORS.get(status or "", "#57606a")
    return f'<span class="badge" style="background:{color}">{_e(status or "unknown")}</span>'


def _code(source: str | None, cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f"<pre{attr}><code>{_e(source)}</code></pre>" if source else f"<p>{NONE}</p>"


def _timed_ok(nodes: list[dict]) -> list[dict]:
    ok = [n for n in nodes if n.get("status") == "ok" and n.get("timed") and n.get("runtime_ms") is not None]
    return sorted(ok, key=lambda n: n.get("id", 0))


def _header(view: dict) -> str:
    run, problem = view.get("run") or {}, view.get("problem") or {}
    versions = ", ".join(f"{k} {_e(run.get(f'{k}_version') or NONE)}" for k in ("kernelevolve", "torch", "triton"))
    shown = dict(run.get("config") or {})
    if shown.get("starts"):  # their sources are the start nodes' own, in the tree below
        shown["starts"] = [s.get("name") for s in shown["starts"]]
    config = json.dumps(shown, indent=2, sort_keys=True, default=str)
    return (f"<h1>{_e(problem.get('name') or 'problem')}: run {_e(run.get('id'))}</h1>"
            f'<p class="meta">device {_e(run.get("device"))} · status {_e(run.get("status"))} · '
            f"created {_e(run.get('created'))} · finished {_e(run.get('finished') or NONE)}<br>{versions}<br>"
            f"problem {_e(problem.get('path'))} · sha {_e((problem.get('sha') or '')[:12])}<br>"
            f"stopped: {_e(run.get('stop_reason') or NONE)} · {_e(_phases(view.get('phases') or {}))}</p>"
            f"<details><summary>config</summary>{_code(config)}</details>")


PHASE_NAMES = {"profile_s": "profile", "baseline_s": "baselines", "first_proposal_s": "first proposal",
               "search_s": "search"}


def _phases(phases: dict) -> str:
    """Where the run's time went; the search budget counts from the first proposal on."""
    parts = [f"{PHASE_NAMES.get(k, k)} {v:.1f} s" for k, v in phases.items() if isinstance(v, (int, float))]
    return "time: " + ", ".join(parts) if parts else "time: not recorded"


def _card(value: str, label: str) -> str:
    return f'<div class="card"><b>{value}</b><span>{_e(label)}</span></div>'


def _summary(nodes: list[dict], best: dict | None = None) -> str:
    """The cards at the top: what best.py is where it is no candidate, then the candidates' best figures (those of
    the fastest candidate, not the best, where best.py is a baseline)."""
    timed = _timed_ok(nodes)
    eager = [n["speedup_eager"] for n in timed if n.get("speedup_eager") is not None]
    comp = [n["speedup_compile"] for n in timed if n.get("speedup_compile") is not None]
    cards = []
    lead, runtime = "best speedup", "best runtime"
    if best and best.get("node") is None:
        side = LABELS.get(best.get("baseline") or "", "a baseline")
        answer = "the reference" if best.get("reference") else f"{side}'s kernel"
        cards.append(_card(_e(answer), "is best.py: no candidate beat it" if timed else "is best.py"))
        lead, runtime = "fastest candidate", "runtime of the fastest candidate"
    cards += [_card(_x(max(eager, default=None)), f"{lead} vs eager"),
              _card(_x(max(comp, default=None)), f"{lead} vs torch.compile"),
              _card(_num(min((n["runtime_ms"] for n in timed), default=None), suffix=" ms"), runtime),
              _card(str(len(nodes)), "candidates")]
    untimed = sum(1 for n in nodes if n.get("status") == "ok" and not n.get("timed"))
    if untimed:
        cards.append(_card(str(untimed), "ok but untimed"))
    for status, count in sorted(Counter(n.get("status") or "unknown" for n in nodes).items()):
        cards.append(_card(str(count), status))
    return f'<h2>Summary</h2><div class="cards">{"".join(cards)}</div>'


def _screen(sc: dict | None) -> str:
    """The screen's counts, its time distribution and its agreement with the judge."""
    if not sc:
        return ""
    pairs = [("screened", str(sc["screened"])), ("sent on to the judge", str(sc["finalists"])),
             ("outcomes", ", ".join(f"{v} {k}" for k, v in sorted(sc["statuses"].items())))]
    ms = sc.get("ms")
    if ms:
        pairs.append((f"screen time over {ms['timed']} timed",
                      " · ".join(f"{k} {_num(ms[k], suffix=' ms')}" for k in ("min", "p10", "median", "p90", "max"))))
    agree = sc.get("agreement")
    if agree:
        pairs.append((f"judge against screen ({agree['pairs']} judged)",
                      f"median ratio {_num(agree.get('median_judge_over_screen'), '.3g')}, rank correlation "
                      f"{_num(agree.get('spearman'), '.2f')}"))
    return f"<h2>Screen</h2>{_kv(pairs)}"


def _baseline(base: dict | None) -> str:
    if not base:
        return f"<h2>Baseline</h2><p>{NONE}</p>"
    clocks = base.get("clocks") or {}

    def timed(key: str, ms: Any) -> str:
        c = clocks.get(key) or {}
        extra = [f"{name} {_num(c.get(k))} ms" for name, k in (("device", "device_ms"), ("host", "host_ms"),
                                                                   ("graph", "graph_ms")) if c.get(k) is not None]
        return _num(ms, suffix=" ms") + (f" ({', '.join(extra)})" if extra else "")

    pairs = [("eager", timed("eager", base.get("eager_ms"))),
             ("torch.compile", timed("compiled", base.get("compile_ms"))),
             ("compile time", _num(base.get("compile_s"), ".3g", " s"))]
    err = _code(base.get("error"), "err") if base.get("error") else ""
    return f"<h2>Baseline</h2>{_kv(pairs)}{err}"


def _head_to_head(h2h: dict | None) -> str:
    """The rounds before the answer: each side's median, the answer's speedups with their bounds, the verdict."""
    if not h2h:
        return ""
    view = HeadToHead.from_dict(h2h)
    if view.error:
        return f"<h2>Head to head</h2><p>{_e(view.line())}</p>"
    rows = [[_e(LABELS.get(side, side)), _num(ms), _x(view.speedup.get(side)),
             f"{_num(view.low.get(side), '.3f')}-{_num(view.high.get(side), '.3f')}" if side in view.low else NONE,
             _e(view.notes.get(side, ""))] for side, ms in view.ms.items()]
    table = _table(["side", "median of rounds, ms", "answer's speedup", "bounds", "note"], rows, frozenset({1, 2}))
    return f"<h2>Head to head</h2><p>{_e(view.line())}</p>{table}"


def _llm(usage: dict | None, config: dict | None = None, stop_reason: str | None = None) -> str:
    """Language-model calls of the run: counts, tokens and cost, in all and per model, against the run's budget
    (nothing when there were none)."""
    if not usage:
        return ""
    headers = ["model", "calls", "candidates", "no code", "repeats", "failed", "input tokens", "output tokens", "cost"]
    rows = [[_e(name), str(u["calls"]), str(u["candidates"]), str(u["no_code"]), str(u.get("repeats", 0)),
             str(u["errors"]), str(u["input_tokens"]), str(u["output_tokens"]),
             "—" if u["cost_usd"] is None else f"${u['cost_usd']:.4f}"]
            for name, u in [*usage["by_model"].items(), ("all", usage)]]
    lim = SpendLimits.from_options((config or {}).get("proposer_options") or {})
    budget = [("budget: calls", str(lim.calls or "no limit")), ("budget: tokens", str(lim.tokens or "no limit")),
              ("budget: cost", _num(lim.cost_usd, "g", " USD") if lim.cost_usd else "no limit")]
    if stop_reason and "budget" in stop_reason:
        budget.append(("stopped", _e(stop_reason)))
    return f"<h2>Model calls</h2>{_table(headers, rows, frozenset(range(1, 9)))}{_kv(budget)}"


def _approvals(rows: list[dict] | None) -> str:
    """The audit trail: every approval of a node of this run, with the source hash it covers."""
    if not rows:
        return "<h2>Approvals</h2><p>None: export needs <code>kernelevolve approve</code> first.</p>"
    table = [[_e(a["created"]), _e(a["approved_by"]), str(a["node_id"]), _e(a["candidate_sha"][:16]), _e(a["note"])]
             for a in rows]
    return f"<h2>Approvals</h2>{_table(['when', 'by', 'node', 'source sha256', 'note'], table)}"


def _profile(prof: dict | None) -> str:
    if not prof:
        return f"<h2>Profile</h2><p>{NONE}</p>"
    pairs = [("device", _e(prof.get("device_name"))), ("FLOPs", _si(prof.get("flops"), "FLOP")),
             ("bytes", _si(prof.get("bytes"), "B")), ("roofline floor", _num(prof.get("floor_ms"), suffix=" ms")),
             ("bound", _e(prof.get("bound"))), ("eager (profiled)", _num(prof.get("eager_ms"), suffix=" ms")),
             ("intensity", _num(prof.get("intensity"), ".3g", " FLOP/B")),
             ("ridge", _num(prof.get("ridge"), ".3g", " FLOP/B")),
             ("peak compute", _si(prof.get("peak_flops"), "FLOP/s")),
             ("peak bandwidth", _si(prof.get("peak_bw"), "B/s")),
             ("ceilings source", _e(prof.get("ceilings_source")))]
    ops = [[_e(o.get("name")), _num(o.get("self_ms"), ".4g"), _num(o.get("pct"), ".1f", "%"), _e(o.get("calls"))]
           for o in prof.get("top_ops") or []]
    notes = "".join(f"<li>{_e(n)}</li>" for n in prof.get("notes") or [])
    return (f"<h2>Profile</h2>{_kv(pairs)}<h3>Top ops</h3>"
            + (_table(["op", "self ms", "share", "calls"], ops, frozenset({1, 2, 3})) if ops else f"<p>{NONE}</p>")
            + (f"<h3>Notes</h3><ul>{notes}</ul>" if notes else ""))


def _chart(nodes: list[dict], eager_ms: float | None, width: int = 760, height: int = 300) -> str:
    points = _timed_ok(nodes)
    left, right, top, bottom = 64, 16, 16, 44
    w, h = width - left - right, height - top - bottom
    parts = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">',
             f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="#fff" stroke="#d0d7de"/>',
             f'<text x="{left + w / 2}" y="{height - 8}" text-anchor="middle">evaluation order (node id)</text>',
             f'<text transform="translate(14 {top + h / 2}) rotate(-90)" text-anchor="middle">runtime (ms)</text>']
    if not points:
        parts.append(f'<text x="{left + w / 2}" y="{top + h / 2}" text-anchor="middle">no timed candidates</text>')
        return "<h2>Progress</h2>" + "".join(parts) + "</svg>"
    ids = [n["id"] for n in points]
    ymax = max([n["runtime_ms"] for n in points] + ([eager_ms] if eager_ms else [])) * 1.08
    x0, span = min(ids), max(max(ids) - min(ids), 1)
    sx: Callable[[float], float] = (lambda i: left + w / 2) if len(ids) == 1 else (lambda i: left + (i - x0) / span * w)
    sy: Callable[[float], float] = lambda v: top + h - v / ymax * h
    for frac in (0, 0.25, 0.5, 0.75, 1):
        y = sy(ymax * frac)
        parts.append(f'<line x1="{left}" x2="{left + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eaeef2"/>'
                     f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{ymax * frac:.3g}</text>')
    for i in sorted({ids[0], ids[-1], ids[len(ids) // 2]}):
        parts.append(f'<text x="{sx(i):.1f}" y="{top + h + 16}" text-anchor="middle">{i}</text>')
    if eager_ms:
        y = sy(eager_ms)
        parts.append(f'<line x1="{left}" x2="{left + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#bc4c00" '
                     f'stroke-dasharray="5 4"/><text x="{left + w - 4}" y="{y - 4:.1f}" text-anchor="end">eager</text>')
    parts.append(_best_line(points, sx, sy))
    for n in points:
        tip = f"node {n['id']}: {n['runtime_ms']:.4g} ms, {_x(n.get('speedup_eager'))} vs eager"
        parts.append(f'<a href="#node-{n["id"]}"><circle cx="{sx(n["id"]):.1f}" cy="{sy(n["runtime_ms"]):.1f}" '
                     f'r="4" fill="#0969da" fill-opacity="0.6"><title>{_e(tip)}</title></circle></a>')
    legend = '<p class="meta">dots: timed ok candidates; line: the fastest candidate so far; dashed: eager baseline</p>'
    return "<h2>Progress</h2>" + "".join(parts) + "</svg>" + legend


def _best_line(points: list[dict], sx: Callable[[float], float], sy: Callable[[float], float]) -> str:
    coords, best = [], float("inf")
    for n in points:
        if n["runtime_ms"] < best and coords:
            coords.append(f"{sx(n['id']):.1f},{sy(best):.1f}")  # step down at the improving candidate
        best = min(best, n["runtime_ms"])
        coords.append(f"{sx(n['id']):.1f},{sy(best):.1f}")
    return f'<polyline points="{" ".join(coords)}" fill="none" stroke="#1a7f37" stroke-width="2"/>'


def _best(best: dict | None) -> str:
    if not best:
        return f"<h2>Best candidate</h2><p>{NONE}</p>"
    node = best.get("node")
    if node is not None:
        link = f'<a href="#node-{_e(node)}">node {_e(node)}</a>'
    else:
        link = "the reference" if best.get("reference") else NONE
    diff = (f"<h3>Against the start kernel {_e(best['start'])}</h3>{_code(best['diff'])}" if best.get("diff")
            else "")
    return f"<h2>Best candidate</h2><p>{link}: {_e(best.get('why'))}</p>{diff}{_code(best.get('source'))}"


def _starts(starts: list[dict] | None) -> str:
    """The user's start kernels: each one's verdict and time, and the best's speedup over it."""
    if not starts:
        return ""
    rows = [[_e(s["name"]), f'<a href="#node-{s["node"]}">{s["node"]}</a>', _e(s["status"]),
             _num(s.get("runtime_ms"), suffix=" ms"), _num(s.get("best_over"), ".3g", "x")] for s in starts]
    return f"<h2>Start kernels</h2>{_table(['file', 'node', 'verdict', 'time', 'best over it'], rows)}"


NODE_HEADERS = ["id", "parent", "proposer", "what", "language", "status", "reason", "runtime ms", "device ms",
                "host ms", "graph ms", "timed", "vs eager", "vs compile", "compile s", "wall s", "cached"]


def _timed_cell(node: dict) -> str:
    if node.get("timed"):
        return "timed"
    return '<span class="badge untimed">untimed</span>' if node.get("status") == "ok" else NONE


def _node_rows(node: dict) -> str:
    nid, parent = node.get("id"), node.get("parent")
    untimed = node.get("status") == "ok" and not node.get("timed")
    cells = [f'<a href="#node-{_e(nid)}">{_e(nid)}</a>',
             f'<a href="#node-{_e(parent)}">{_e(parent)}</a>' if parent is not None else NONE,
             _e(node.get("proposer")), _e((node.get("meta") or {}).get("label", "")), _e(node.get("language")),
             _badge(node.get("status")), _e(node.get("reason")),
             _num(node.get("runtime_ms")), _num(node.get("device_ms")),
             _num(node.get("host_ms")) + (" (launch-bound)" if node.get("launch_bound") else ""),
             _num(node.get("graph_ms")), _timed_cell(node), _x(node.get("speedup_eager")),
             _x(node.get("speedup_compile")), _num(node.get("compile_s"), ".3g"), _num(node.get("wall_s"), ".3g"),
             "yes" if node.get("cached") else "no"]
    num = {7, 8, 9, 10, 12, 13, 14, 15}
    tds = "".join(f'<td{" class=num" if i in num else ""}>{c}</td>' for i, c in enumerate(cells))
    meta = json.dumps(node.get("meta") or {}, sort_keys=True, default=str)
    detail = (f"<details><summary>source, error, meta (sha {_e((node.get('sha') or '')[:12])}, "
              f"created {_e(node.get('created'))})</summary>{_code(node.get('source'))}"
              + (_code(node.get("error"), "err") if node.get("error") else "")
              + f"{_code(meta)}</details>")
    row_cls = ' class="untimed-row"' if untimed else ""
    return (f'<tr id="node-{_e(nid)}"{row_cls}>{tds}</tr>'
            f'<tr><td colspan="{len(cells)}">{detail}</td></tr>')


def _nodes(nodes: list[dict]) -> str:
    if not nodes:
        return f"<h2>Candidates</h2><p>{NONE}</p>"
    head = "".join(f"<th>{_e(h)}</th>" for h in NODE_HEADERS)
    rows = "".join(_node_rows(n) for n in sorted(nodes, key=lambda n: n.get("id", 0)))
    note = '<p class="meta">untimed: verified but not benchmarked (e.g. ran in the interpreter)</p>'
    return f"<h2>Candidates</h2>{note}<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def render_report(view: dict) -> str:
    """Render one run's view as a self-contained HTML document (no external resources)."""
    nodes = view.get("nodes") or []
    problem, run = view.get("problem") or {}, view.get("run") or {}
    baseline = view.get("baseline") or {}
    title = f"{problem.get('name') or 'problem'}: run {run.get('id')}"
    body = [_header(view), _summary(nodes, view.get("best")), _screen(view.get("screen")),
            _baseline(view.get("baseline")),
            _llm(view.get("llm_usage"), run.get("config"), run.get("stop_reason")), _starts(view.get("starts")),
            _profile(view.get("profile")), roofline_svg(view.get("profile"), view.get("roofline_points") or []),
            counters_html((view.get("profile") or {}).get("counters")),
            _chart(nodes, baseline.get("eager_ms")), _head_to_head(view.get("head_to_head")), _best(view.get("best")),
            _approvals(view.get("approvals")),
            _nodes(nodes),
            f"<h2>Problem source</h2>{_code(problem.get('source'))}"]
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>\n")


def write_report(view: dict, path: str | Path) -> Path:
    """Write the report for ``view`` to ``path``, creating parent directories; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_report(view), encoding="utf-8")
    return out


def report_view(store: Store, run_id: int | str) -> dict[str, Any]:
    """Everything the HTML report shows, from the store alone, as plain data (the typed rows end here)."""
    run = store.run(run_id)
    problem = store.problem_source(run.problem_sha)
    baseline = run.baseline
    history = store.nodes(run.id)
    best, why = best_node(history)
    h2h = run.head_to_head
    nodes = [_node_view(n, baseline) for n in history]
    answer = _best_view(best, why, baseline, problem.source, history, run.stop_reason, h2h)
    return {
        "run": {"id": run.id, "device": run.device_key, "status": run.status, "created": run.created,
                "finished": run.finished, "config": run.config, "stop_reason": run.stop_reason,
                "kernelevolve_version": run.versions.get("kernelevolve"), "torch_version": run.versions.get("torch"),
                "triton_version": run.versions.get("triton")},
        "problem": {"name": problem.name, "path": problem.path, "sha": problem.sha, "source": problem.source},
        "profile": run.profile.to_dict() if run.profile else None,
        "baseline": None if baseline is None else {
            "eager_ms": baseline.eager.median_ms if baseline.eager else None,
            "compile_ms": baseline.compiled.median_ms if baseline.compiled else None,
            "compile_s": baseline.compile_s, "error": baseline.error, "clocks": _clocks_view(baseline)},
        "best": _with_start_diff(answer, history),
        "head_to_head": h2h.to_dict() if h2h is not None else None,
        "starts": _starts_view(history, best),
        "roofline_points": _roofline_points(baseline, history, best, answered=answer["node"] is not None),
        "phases": run.phases,
        "nodes": nodes,
        "screen": screen_summary(history),
        "llm_usage": store.llm_usage(run.id),
        "approvals": [asdict(a) for a in store.approvals(run.id)],
    }


def screen_summary(history: Sequence[Node]) -> dict[str, Any] | None:
    """How many the screen checked and sent on, the distribution of its times, and how its times agree with the
    judge's on the nodes both timed (the median ratio of judge to screen, and Spearman's rank correlation)."""
    screened = [n for n in history if n.screen is not None]
    if not screened:
        return None
    times = sorted(n.screen.ms for n in screened if n.screen.ms is not None)
    both = [(n.screen.ms, n.runtime_ms) for n in screened if n.screen.ms is not None and n.runtime_ms is not None]
    statuses = Counter(n.screen.status.value for n in screened)
    out: dict[str, Any] = {"screened": len(screened), "finalists": sum(n.finalist for n in screened),
                           "judged": sum(n.result is not None for n in screened), "statuses": dict(statuses),
                           "ms": None, "agreement": None}
    if times:
        out["ms"] = {"min": times[0], "p10": _quantile(times, 0.1), "median": statistics.median(times),
                     "p90": _quantile(times, 0.9), "max": times[-1], "timed": len(times)}
    if both:
        ratios = [j / sc for sc, j in both if sc > 0]
        out["agreement"] = {"pairs": len(both), "median_judge_over_screen": statistics.median(ratios) if ratios
                            else None, "spearman": _spearman(both) if len(both) >= 3 else None}
    return out


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _spearman(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None when either side has no spread."""
    def ranks(values: Sequence[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    a, b = ranks([p[0] for p in pairs]), ranks([p[1] for p in pairs])
    ma, mb = statistics.mean(a), statistics.mean(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    var = math.sqrt(sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b))
    return cov / var if var else None


REFERENCE_CANDIDATE = '''"""The reference itself: {why}."""
{source}


class ModelNew(Model):
    pass
'''


UNBEATEN = "no candidate of this run beat eager PyTorch on this device"


def reference_candidate(source: str, why: str = UNBEATEN) -> str:
    """A candidate file that is the problem's reference itself (``class ModelNew(Model)``)."""
    return REFERENCE_CANDIDATE.format(why=why, source=source.rstrip())


def _best_view(best: Node | None, why: str, baseline: Baseline | None, source: str,
               history: Sequence[Node] = (), stop_reason: str | None = None,
               h2h: HeadToHead | None = None) -> dict[str, Any]:
    """The best node, or the best baseline's kernel (the reference itself, or torch.compile's) where no candidate
    was verified, the head-to-head found the winner no faster than that baseline, or (without a head-to-head) the
    judge timed it slower: every run answers with a kernel, never one slower than its best baseline, and says why
    in one line. ``speedups`` are the answer's over each baseline, from the head-to-head where there was one."""
    if best is None:
        judged = [n.result for n in history if n.result is not None]
        if judged:
            counts: dict[str, int] = {}
            for r in judged:
                counts[r.status.value] = counts.get(r.status.value, 0) + 1
            what = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
            why = f"no candidate was verified ({len(judged)} evaluated: {what})"
        else:
            why = "no candidate was evaluated" + (f" (stopped: {stop_reason})" if stop_reason else "")
        return {"node": None, "reference": True, "why": f"{why}: best.py is the reference itself",
                "source": reference_candidate(source, why)}
    if h2h is not None and h2h.answer and not h2h.wins:
        return _baseline_answer(h2h.answer, h2h.line(), source, dict(h2h.speedup))
    if h2h is not None and h2h.wins:
        return {"node": best.id, "source": best.source, "why": f"{why}; {h2h.line()}",
                "speedups": dict(h2h.speedup)}
    r = best.result
    timed = {k: t.median_ms for k, t in (("eager", baseline and baseline.eager),
                                          ("compiled", baseline and baseline.compiled)) if t}
    if timed and r is not None and r.timed and r.runtime_ms is not None and r.runtime_ms > min(timed.values()):
        side = min(timed, key=timed.__getitem__)
        line = (f"no candidate beat {LABELS[side]} ({timed[side]:.4g} ms; the fastest took {r.runtime_ms:.4g} ms, "
                f"node {best.id}): best.py is {'the reference itself' if side == 'eager' else 'its own kernel'}")
        if h2h is not None:
            line += f"; {h2h.line()}"
        return _baseline_answer(side, line, source, {k: v / timed[side] for k, v in timed.items()})
    if h2h is not None:
        why = f"{why}; {h2h.line()}"
    return {"node": best.id, "source": best.source, "why": why}


def _baseline_answer(side: str, why: str, source: str, speedups: dict[str, float]) -> dict[str, Any]:
    """best.py as the baseline ``side``: the reference itself (eager), or torch.compile's kernel of it with that
    side's options."""
    if side == "eager":
        return {"node": None, "reference": True, "baseline": side, "why": why, "speedups": speedups,
                "source": reference_candidate(source, why)}
    return {"node": None, "reference": False, "baseline": side, "why": why, "speedups": speedups,
            "source": compiled_source(source, COMPILE_OPTIONS[side], LABELS[side])}


def _clocks_view(baseline: Baseline) -> dict[str, Any]:
    """Each baseline's clocks as plain data."""
    return {k: t.clocks() for k, t in (("eager", baseline.eager), ("compiled", baseline.compiled)) if t is not None}


def start_of(node: Node, history: Sequence[Node]) -> Node | None:
    """The start kernel (a root of proposer ``start``) that ``node`` descends from, if any."""
    by_id = {n.id: n for n in history}
    while node is not None:
        if node.meta.get("start"):
            return node
        node = by_id.get(node.parent) if node.parent is not None else None
    return None


def _with_start_diff(best: dict[str, Any], history: Sequence[Node]) -> dict[str, Any]:
    node = next((n for n in history if n.id == best.get("node")), None)
    root = start_of(node, history) if node is not None else None
    if root is None or root.id == node.id:
        return best
    return dict(best, start=root.meta["start"], diff=diff_text(root.source, node.source, root.meta["start"]))


def _roofline_points(baseline: Baseline | None, history: Sequence[Node], best: Node | None,
                     answered: bool = True) -> list[tuple[str, float]]:
    """(label, ms) of the timed kernels the roofline plot places: eager, torch.compile, each start, and the fastest
    candidate: "best" where best.py is that candidate (``answered``), else "fastest candidate"."""
    points = []
    if baseline is not None:
        points += [(label, t.median_ms) for label, t in (("eager", baseline.eager),
                                                          ("torch.compile", baseline.compiled)) if t is not None]
    points += [(f"start {n.meta['start']}", n.runtime_ms) for n in history if n.meta.get("start") and n.runtime_ms]
    if best is not None and best.runtime_ms and not best.meta.get("start"):
        points.append((f"{'best' if answered else 'fastest candidate'} (node {best.id})", best.runtime_ms))
    return points


def _starts_view(history: Sequence[Node], best: Node | None) -> list[dict[str, Any]]:
    out = []
    for n in history:
        if n.meta.get("start"):
            ms = n.runtime_ms
            over = ms / best.runtime_ms if ms and best is not None and best.runtime_ms else None
            out.append({"name": n.meta["start"], "node": n.id, "status": n.result.status.value if n.result else
                        "pending", "runtime_ms": ms, "best_over": over})
    return out


def _node_view(node: Node, baseline: Baseline | None) -> dict[str, Any]:
    r = node.result.with_baseline(baseline) if node.result else None
    sc = node.screen
    status = r.status.value if r else ("screened out" if node.screened_out else "pending")
    return {"id": node.id, "parent": node.parent, "proposer": node.proposer, "language": node.language,
            "sha": node.sha, "status": status, "reason": _reason(r) or (f"screen: {sc.reason}" if sc else ""),
            "screen_status": sc.status.value if sc else None, "screen_ms": sc.ms if sc else None,
            "finalist": node.finalist,
            "runtime_ms": r.runtime_ms if r else None, "timed": bool(r and r.timed),
            **(r.timing.clocks() if r and r.timing else {}),
            "speedup_eager": r.speedup_eager if r else None, "speedup_compile": r.speedup_compile if r else None,
            "compile_s": r.compile_s if r else None, "load_s": r.load_s if r else None,
            "wall_s": r.wall_s if r else None, "created": node.created, "cached": node.cached,
            "meta": node.meta, "error": (r.error if r else "") or "", "source": node.source}


def _reason(r: Result | None) -> str:
    if r is None:
        return ""
    suspect = r.details.get("suspect")
    return f"{r.reason}; SUSPECT: {suspect}" if suspect else r.reason


def write_outputs(store: Store, run_id: int, out_dir: Path) -> tuple[dict[str, Path], str]:
    """Write best.py (the best verified candidate, else the reference itself) and report.html into ``out_dir``;
    return the files and the one line that says why best.py is what it is."""
    out_dir.mkdir(parents=True, exist_ok=True)
    view = report_view(store, run_id)
    files = {"report": write_report(view, out_dir / "report.html")}
    best = view["best"]
    path = out_dir / "best.py"
    path.write_text(provenance(view) + best["source"])
    files["best"] = path
    return files, best["why"]


def provenance(view: dict[str, Any]) -> str:
    """The comment lines that open best.py: which run and node it is, who proposed it, and the judge's verdict."""
    run, best = view["run"], view["best"]
    head = f"# kernelevolve: run {run['id']} of {view['problem']['name']} on {run['device']}"
    node = next((n for n in view["nodes"] if n["id"] == best.get("node")), None)
    if node is None:
        return f"{head}; no node: {best['why']}\n"
    what = (node.get("meta") or {}).get("label")
    verdict = f"{node['status']}: {node['reason']}"
    if node["timed"] and node["runtime_ms"] is not None:
        verdict += (f"; {node['runtime_ms']:.4g} ms, {_x(node['speedup_eager'])} eager, "
                    f"{_x(node['speedup_compile'])} torch.compile")
    h2h = view.get("head_to_head")
    rounds = f"# {HeadToHead.from_dict(h2h).line()}\n" if h2h else ""
    return (f"{head}\n# node {node['id']}, proposer {node['proposer']}{f' ({what})' if what else ''}, "
            f"source sha256 {node['sha'][:16]}\n# verdict: {verdict}\n{rounds}")


def _x(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}x"
