"""Where a run's kernels stand against the device, for the report: a roofline plot with the reference, its
torch.compile, the start kernels and the best candidate placed on it, and the hardware-counter table of each kernel
ncu read (``kernelevolve.counters``)."""
from __future__ import annotations

import math
from html import escape
from typing import Any

NONE = "—"
MAX_LABELS = 8  # kernels labelled beside the plot, the fastest first; the others have their dot and its tooltip
LABEL_CHARS = 22  # a label's length beside the plot (the right margin's 150 px at 11 px type)
LABEL_GAP = 14.0  # px between labels' baselines


def _fmt(v: Any, spec: str = ".3g") -> str:
    return NONE if v is None else format(v, spec)


def roofline_svg(prof: dict[str, Any] | None, points: list[tuple[str, float]], width: int = 760,
                 height: int = 320) -> str:
    """The problem on the device's roofline: x its arithmetic intensity (FLOP per byte it must move), y the FLOP/s
    each timed kernel (label, ms) reaches; the roof is min(peak bandwidth x intensity, peak compute). Where no FLOP
    is counted (memory-bound ops), y is the bandwidth each reaches against the peak instead."""
    if not prof or not points or not prof.get("peak_bw") or not prof.get("peak_flops"):
        return ""
    flops, nbytes = prof.get("flops") or 0, prof.get("bytes") or 0
    if not nbytes:
        return ""
    left, right, top, bottom = 70, 150, 16, 44
    w, h = width - left - right, height - top - bottom
    if flops:
        x = flops / nbytes
        peak = (prof["peak_flops"], prof["peak_bw"])
        values = [(label, flops / (ms / 1e3)) for label, ms in points if ms]
        xlo, xhi = min(x, prof["ridge"]) / 100, max(x, prof["ridge"]) * 100
        ylo, yhi = min([v for _, v in values] + [peak[0]]) / 100, max([v for _, v in values] + [peak[0]]) * 2
        unit, axis = "FLOP/s", "arithmetic intensity (FLOP/byte)"
    else:
        x, peak = 1.0, (prof["peak_bw"], None)
        values = [(label, nbytes / (ms / 1e3)) for label, ms in points if ms]
        xlo, xhi = 0.1, 10.0
        ylo, yhi = min([v for _, v in values] + [peak[0]]) / 10, max([v for _, v in values] + [peak[0]]) * 2
        unit, axis = "B/s", "(no FLOPs counted: bandwidth reached)"
    sx = lambda v: left + (math.log10(v) - math.log10(xlo)) / (math.log10(xhi) - math.log10(xlo)) * w  # noqa: E731
    sy = lambda v: top + h - (math.log10(v) - math.log10(ylo)) / (math.log10(yhi) - math.log10(ylo)) * h  # noqa: E731
    parts = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">',
             f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="#fff" stroke="#d0d7de"/>',
             f'<text x="{left + w / 2}" y="{height - 8}" text-anchor="middle">{escape(axis)}</text>',
             f'<text transform="translate(14 {top + h / 2}) rotate(-90)" text-anchor="middle">{unit}</text>']
    parts += _ticks(xlo, xhi, sx, lambda t: f'x="{t:.1f}" y="{top + h + 16}" text-anchor="middle"',
                    lambda t: f'x1="{t:.1f}" x2="{t:.1f}" y1="{top}" y2="{top + h}"')
    parts += _ticks(ylo, yhi, sy, lambda t: f'x="{left - 6}" y="{t + 4:.1f}" text-anchor="end"',
                    lambda t: f'x1="{left}" x2="{left + w}" y1="{t:.1f}" y2="{t:.1f}"')
    if peak[1]:  # the roof: the bandwidth slope up to the ridge, then the compute ceiling
        ridge = peak[0] / peak[1]
        xs = [xlo, min(max(ridge, xlo), xhi), xhi]
        ys = [max(min(peak[1] * v, peak[0]), ylo) for v in xs]
        parts.append('<polyline fill="none" stroke="#bc4c00" stroke-width="2" points="'
                     + " ".join(f"{sx(a):.1f},{sy(b):.1f}" for a, b in zip(xs, ys)) + '"/>')
    else:
        parts.append(f'<line x1="{left}" x2="{left + w}" y1="{sy(peak[0]):.1f}" y2="{sy(peak[0]):.1f}" '
                     'stroke="#bc4c00" stroke-width="2"/>')
    roof = min(peak[1] * x, peak[0]) if peak[1] else peak[0]
    dots = sorted(((label, v, sy(max(v, ylo))) for label, v in values), key=lambda d: d[2])
    shown = _label_rows([y for _, _, y in dots[:MAX_LABELS]], top + 10, top + h)
    for k, (label, v, y) in enumerate(dots):
        tip = f"{label}: {v:.3g} {unit}, {100 * v / roof:.0f}% of the roof"
        parts.append(f'<circle cx="{sx(x):.1f}" cy="{y:.1f}" r="5" fill="#0969da" fill-opacity="0.7">'
                     f'<title>{escape(tip)}</title></circle>')
        if k < len(shown):  # the fastest few, each on a row of its own beside the plot, a leader line to its dot
            name = label if len(label) <= LABEL_CHARS else label[:LABEL_CHARS - 1] + "…"
            parts.append(f'<text x="{left + w + 8}" y="{shown[k] + 4:.1f}">{escape(name)}: {100 * v / roof:.0f}%'
                         f'<title>{escape(tip)}</title></text><line x1="{sx(x):.1f}" x2="{left + w + 4}" '
                         f'y1="{y:.1f}" y2="{shown[k]:.1f}" stroke="#d0d7de"/>')
    note = ('<p class="meta">line: the roof (peak bandwidth, then peak compute); dots: each kernel, the fastest '
            f"{MAX_LABELS} labelled with their share of the roof at the problem's intensity (hover a dot for its "
            "own)</p>")
    return "<h2>Roofline</h2>" + "".join(parts) + "</svg>" + note


def _ticks(lo: float, hi: float, scale: Any, text_at: Any, line_at: Any) -> list[str]:
    """A log axis's decades between ``lo`` and ``hi``: a faint grid line and the value at each."""
    out = []
    for e in range(math.ceil(math.log10(lo)), math.floor(math.log10(hi)) + 1):
        t = scale(10.0 ** e)
        out.append(f'<line {line_at(t)} stroke="#eaeef2"/><text {text_at(t)}>{_decade(e)}</text>')
    return out


def _decade(e: int) -> str:
    """10**e in a few characters: 0.01, 1, 100, 10k, 1G, 100T."""
    if e < 0:
        return f"{10.0 ** e:g}"
    prefix = ["", "k", "M", "G", "T", "P", "E"][min(e // 3, 6)]
    return f"{10 ** (e - 3 * min(e // 3, 6))}{prefix}"


def _label_rows(ys: list[float], low: float, high: float) -> list[float]:
    """Rows for labels wanted at ``ys`` (ascending), at least LABEL_GAP apart and within [low, high]: each as close to
    its dot as the ones above it allow, then pushed up together where the last would fall off the bottom."""
    rows: list[float] = []
    for y in ys:
        rows.append(max(y, low, rows[-1] + LABEL_GAP if rows else low))
    over = (rows[-1] - high) if rows else 0.0
    for k in range(len(rows) - 1, -1, -1):
        if over <= 0:
            break
        rows[k] -= over
        over = rows[k - 1] + LABEL_GAP - rows[k] if k else 0.0
    return rows


def counters_html(counters: dict[str, Any] | None) -> str:
    """One table per kernel set ncu read (the reference, each start kernel, the best), or why it could not."""
    if not counters:
        return ""
    out = ["<h2>Hardware counters (ncu)</h2>"]
    head = ["kernel", "us", "DRAM %", "SM %", "tensor %", "occupancy %", "regs", "spill B", "L2 hit %", "bound"]
    for target, got in counters.items():
        out.append(f"<h3>{escape(target)}</h3>")
        if got.get("error"):
            out.append(f"<p>{escape(got['error'])}</p>")
            continue
        rows = []
        for k in sorted(got.get("kernels", []), key=lambda k: -(k.get("duration_us") or 0)):
            rows.append("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in [
                k["name"], _fmt(k.get("duration_us"), ".2f"), _fmt(k.get("dram_pct"), ".0f"),
                _fmt(k.get("sm_pct"), ".0f"), _fmt(k.get("tensor_pct"), ".0f"), _fmt(k.get("occupancy_pct"), ".0f"),
                _fmt(k.get("registers"), "d"), _fmt(k.get("spill_bytes"), ".0f"), _fmt(k.get("l2_hit_pct"), ".0f"),
                k.get("why", "")]) + "</tr>")
        out.append("<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>" + "".join(rows) + "</table>")
    return "".join(out)
