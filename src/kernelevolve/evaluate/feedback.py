"""The text a kernel engineer wants about a judged candidate, whatever its status: where wrong outputs are wrong, the
lines of the candidate's source an error points at, what a broken rule is for, the log of a timeout or a crash, and a
success's time beside its baselines. For a person to read, and for the prompt of a model that writes the next try."""
from __future__ import annotations

import re
from typing import Any

from kernelevolve.evaluate.checks import REF_ERROR_FACTOR
from kernelevolve.evaluate.mismatch import mismatch_details, mismatch_report
from kernelevolve.evaluate.result import Result, ScreenResult, Status

__all__ = ["describe_failure", "mismatch_details", "mismatch_report", "mismatch_text", "RULES"]

# A frame in the file a candidate runs from: the judge's cand_<sha>_<n>.py, the screen's screen_<sha>_<n>_<k>.py.
_FRAME = re.compile(r'^ *File "(?P<path>(?:[^"]*/)?(?:cand|screen)_[^"/]*\.py)", line (?P<line>\d+)'
                    r'(?:, in (?P<func>.+))?$', re.M)
_ANY_FRAME = re.compile(r'^ *File "[^"]*", line \d+.*$', re.M)
_CHAINED = re.compile(r"^(?:The above exception was the direct cause of the following exception:|"
                      r"During handling of the above exception, another exception occurred:)$", re.M)
_TRITON_AT = re.compile(r"CompilationError: at (\d+):(\d+):$", re.M)
CONTEXT = 2  # lines quoted before the line an error points at (and one after)
MAX_SITES = 3  # lines of the candidate quoted from one traceback
EXCEPTION_LINES = 24  # of the final exception's message: Triton's carries up to 12 lines of kernel source
LOG_LINES = 20

# What each rule a candidate can break is for, found by a fragment of the rejection's reason.
_WORK_IN_CALL = ("All work must be done within the call: a {} the candidate starts must be gone when forward returns, "
                 "or its work escapes the timing and the checks.")
RULES: tuple[tuple[str, str], ...] = (
    ("kernels disabled", "The harness disabled the candidate's Triton kernels and the output was still right: the "
                         "work must be done in its own kernels, not by PyTorch beside them."),
    ("launched none", "A candidate that defines Triton kernels must compute its outputs with them."),
    ("timing functions replaced", "Clocks, timers and the harness's timing functions are not the candidate's to "
                                  "replace or wrap: timings must come from the harness's own clock."),
    ("thread(s) started", _WORK_IN_CALL.format("thread")),
    ("child process(es)", _WORK_IN_CALL.format("process")),
    ("modified input", "forward must leave its inputs as they were, as the reference does: they are reused across "
                       "the timed calls."),
    ("torch.Tensor subclass", "Outputs must be plain torch.Tensor: a subclass could change how they compare."),
    ("hidden timing", "The parent's clock around the timed loop must agree with the times the runs report: work "
                      "hidden outside the timed calls, or forged times, make them disagree."),
    ("s of runs inside", "The times the runs report cannot add up to more than the parent's clock saw: forged "
                         "timing."),
    ("no timed repetition", "Outputs of randomly chosen timed repetitions are checked: they must come back."),
    ("no usable samples", "Every timed repetition must take a finite, non-negative time."),
    ("unreadable output payload", "Outputs reach the judge through the harness's channel, described by their own "
                                  "header: what came back could not be read as the outputs it described."),
    ("protocol violation", "The channel between the harness and the judge is not the candidate's: it must not write "
                           "to it, nor to the file descriptors behind it."),
)


def describe_failure(result: Result | ScreenResult, source: str | None = None, max_chars: int = 3000, *,
                     eager_ms: float | None = None, compile_ms: float | None = None,
                     floor_ms: float | None = None) -> str:
    """What a kernel engineer needs about ``result``, at most ``max_chars`` long, the most useful first.

    incorrect: the reason and the mismatch report (``details["mismatch"]``); compile and runtime errors: the lines of
    the candidate the traceback points at (quoted from ``source`` when given, else as the traceback shows them) and
    the final exception, Triton's kernel excerpt kept as it is; rejected: the rule broken and what it is for; timeout
    and crash: the log's tail; ok: the time, and its ratio to ``eager_ms`` and ``compile_ms`` (the baseline's medians;
    by default from the result's speedups) and to ``floor_ms`` (the roofline floor)."""
    status, reason = result.status, result.reason
    error, log = getattr(result, "error", "") or "", getattr(result, "log", "") or ""
    details = getattr(result, "details", None) or {}
    lines = [f"{status.value}: {reason}"]
    if status is Status.OK:
        lines = _ok_lines(result, eager_ms, compile_ms, floor_ms)
    elif status is Status.INCORRECT and isinstance(details.get("mismatch"), dict):
        try:
            lines.append(mismatch_text(details["mismatch"]))
        except (KeyError, TypeError, ValueError, IndexError):  # a report stored in an older form: the reason stands
            pass
    elif status is Status.INCORRECT and error.strip():  # no report (a wrong type or shape, an older row): the details
        lines += ["details:"] + ["  " + x for x in error.rstrip().splitlines()[-LOG_LINES:]]
    elif status in (Status.COMPILE_ERROR, Status.RUNTIME_ERROR) and error:
        lines += _error_lines(error, source)
    elif status is Status.REJECTED:
        lines += [why for fragment, why in RULES if fragment in reason][:1]
    if status in (Status.TIMEOUT, Status.CRASHED, Status.RUNTIME_ERROR, Status.COMPILE_ERROR) and log.strip():
        lines += ["log tail:"] + ["  " + x for x in log.rstrip().splitlines()[-LOG_LINES:]]
    return _fit("\n".join(lines), max_chars)


def mismatch_text(report: dict[str, Any]) -> str:
    """A mismatch report as a few lines of text, for a person or a prompt."""
    shape, many = report["shape"], report["outputs"] > 1
    name = f"output {report['output']} (of {report['outputs']})" if many else "output"
    tol = (f"atol={report['atol']:g} rtol={report['rtol']:g}" if report["atol"] or report["rtol"]
           else "exact match required")
    if report.get("ref_own_error") is not None:
        tol += f", or {REF_ERROR_FACTOR:g}x the reference's own error {report['ref_own_error']:.3g} from float64"
    lines = [f"{name}: shape {tuple(shape)} {report['dtype']}, {tol}"]
    if len(shape) > 2:
        lines.append(f"read as {report['layout']['rows']} rows (dims 0-{len(shape) - 2} flattened) x "
                     f"{report['layout']['columns']} columns (the last dim)")
    wrong, outside = report["wrong"], report["outside_tolerance"]
    split = f": {outside} outside the tolerance, {wrong - outside} NaN/Inf misplaced" if wrong > outside else ""
    lines.append(f"wrong: {wrong} of {report['elements']} elements ({100 * report['wrong_share']:.3g}%){split}")
    if report["largest"]:
        lines.append(f"max abs err {_text(report['max_abs_err'])}, max rel err {_text(report['max_rel_err'])}; "
                     "largest errors (index: out vs ref):")
        lines += [f"  {e['index']}: {_text(e['out'])} vs {_text(e['ref'])}" for e in report["largest"]]
    nan, inf = report["nan"], report["inf"]
    if any(nan.values()) or any(inf.values()):
        first = "; ".join(f"{e['index']} out {_text(e['out'])} vs ref {_text(e['ref'])}"
                          for e in report["nan_inf_differs"][:3])
        lines.append(f"NaN: {nan['ref']} in reference, {nan['out']} in output; Inf: {inf['ref']} in reference, "
                     f"{inf['out']} in output" + (f"; positions differ at {first}" if first else ""))
    lines.append(f"where: {report['where']['summary']}")
    zeros = report["zeros"]
    if zeros:
        where = "every wrong element" if zeros["count"] == wrong else zeros["summary"]
        lines.append("output exactly 0 where the reference is not" + (" (never written?)" if zeros["never_written"]
                                                                       else "") + f": {where}")
    return "\n".join(lines + _slice_text(report["slice"]))


def _slice_text(cut: dict[str, Any]) -> list[str]:
    c0, c1 = cut["columns"]
    if cut["rows"] is None:
        head, labels = f"elements {c0}-{c1}", [""]
    else:
        head, labels = f"rows {cut['rows'][0]}-{cut['rows'][1]}, columns {c0}-{c1}", [
            f"row {r} " for r in range(cut["rows"][0], cut["rows"][1] + 1)]
    width = max(len(x) for x in labels)
    lines = [f"{head} around the first wrong element {cut['first_wrong']}:"]
    for label, out, ref in zip(labels, cut["out"], cut["ref"]):
        lines.append(f"  {label:<{width}}out {' '.join(f'{_text(v):>10}' for v in out)}")
        lines.append(f"  {'':<{width}}ref {' '.join(f'{_text(v):>10}' for v in ref)}")
    return lines


def _text(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _ok_lines(result: Any, eager_ms: float | None, compile_ms: float | None, floor_ms: float | None) -> list[str]:
    ms = getattr(result, "runtime_ms", None) if isinstance(result, Result) else getattr(result, "ms", None)
    if ms is None or ms <= 0:
        return [f"ok: {result.reason}"]
    timing = getattr(result, "timing", None)
    how = f" (median of {timing.reps}, {timing.method})" if timing else ""
    lines = [f"ok: {ms:.4g} ms{how}"]
    eager_ms = eager_ms or (ms * result.speedup_eager if getattr(result, "speedup_eager", None) else None)
    compile_ms = compile_ms or (ms * result.speedup_compile if getattr(result, "speedup_compile", None) else None)
    for name, base in (("eager PyTorch", eager_ms), ("torch.compile", compile_ms)):
        if base:
            lines.append(f"{name}: {base:.4g} ms, speedup {base / ms:.2f}x")
    if floor_ms:
        lines.append(f"roofline floor: {floor_ms:.4g} ms, {ms / floor_ms:.2f}x the floor")
    suspect = (getattr(result, "details", None) or {}).get("suspect")
    return lines + ([f"suspect: {suspect}"] if suspect else [])


def _error_lines(error: str, source: str | None) -> list[str]:
    """The candidate's lines a traceback points at, then its final exception."""
    blocks = _CHAINED.split(error)  # the first cause first, the exception raised last
    sites: list[re.Match[str]] = []
    for block in blocks:
        frames = list(_FRAME.finditer(block))
        if frames and all(frames[-1]["line"] != s["line"] for s in sites):
            sites.append(frames[-1])  # the innermost frame of the candidate's in each exception of the chain
    if len(sites) > MAX_SITES:
        sites = sites[:1] + sites[-(MAX_SITES - 1):]
    src = source.splitlines() if source is not None else None
    lines: list[str] = []
    for site in sites:
        lines += _quote(site, src)
    final = _final_exception(blocks[-1])
    lines += final
    at = _TRITON_AT.search("\n".join(final))
    line = _kernel_line(final, src) if at and src else None
    if line:
        lines.append(f"(Triton's line {at[1]} of the kernel is line {line} of the candidate)")
    return lines


def _quote(site: re.Match[str], src: list[str] | None) -> list[str]:
    """The candidate's line a frame names with a line or two around it, from the source when there is one; the
    traceback's own copy of the line (and its ^ markers) otherwise."""
    n, func = int(site["line"]), site["func"]
    head = f"candidate line {n}" + (f", in {func}" if func else "") + ":"
    shown = _shown_lines(site)
    if src is None or not 1 <= n <= len(src):
        return [head] + [("  > " if k == 0 else "    ") + x[4:] for k, x in enumerate(shown)]
    out = [head]
    for k in range(max(1, n - CONTEXT), min(len(src), n + 1) + 1):
        prefix = f"  {'>' if k == n else ' '} {k:4d} | "
        out.append(prefix + src[k - 1])
        if k == n:  # the traceback's ^ markers, moved under the source line as printed here
            indent = len(src[k - 1]) - len(src[k - 1].lstrip())
            out += [" " * (len(prefix) + indent) + m[4:] for m in shown[1:] if set(m.strip()) <= set("^~")]
    return out


def _shown_lines(site: re.Match[str]) -> list[str]:
    """The lines a traceback prints under a frame: the code line, then any ^ markers."""
    rest = site.string[site.end():].split("\n")[1:]
    shown = []
    for x in rest:
        if not x.startswith("    ") or _ANY_FRAME.match(x):
            break
        shown.append(x)
    return shown


def _final_exception(block: str) -> list[str]:
    """The message of the exception a traceback ends with, as many lines as it has (up to EXCEPTION_LINES): Triton's
    CompilationError carries the kernel's source with a ^ under the error, kept as it is."""
    frames = list(_ANY_FRAME.finditer(block))
    lines = block[frames[-1].end():].split("\n")[1:] if frames else block.split("\n")
    while lines and lines[0].startswith("    "):  # the last frame's code line and markers
        lines.pop(0)
    lines = [x for x in lines if x.strip()] if not frames else lines
    while lines and not lines[-1].strip():
        lines.pop()
    return lines[:EXCEPTION_LINES] if frames else lines[-EXCEPTION_LINES:]


def _kernel_line(final: list[str], src: list[str]) -> int | None:
    """The candidate's line of Triton's "at L:C:" excerpt: where the excerpt's lines stand in the source, if once."""
    start = next(i for i, x in enumerate(final) if _TRITON_AT.search(x)) + 1
    excerpt = []
    for x in final[start:]:
        if x.strip() and set(x.strip()) <= {"^"}:
            break
        excerpt.append(x.strip())
    if not excerpt:
        return None
    stripped = [x.strip() for x in src]
    found = [i for i in range(len(src) - len(excerpt) + 1) if stripped[i:i + len(excerpt)] == excerpt]
    return found[0] + len(excerpt) if len(found) == 1 else None


def _fit(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    marker = "\n[... cut]"
    cut = text[:max(0, max_chars - len(marker))]
    return (cut.rsplit("\n", 1)[0] if "\n" in cut else cut) + marker
