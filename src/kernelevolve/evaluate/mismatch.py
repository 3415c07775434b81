"""Where and how an output is wrong, as a kernel engineer looks for it: how many elements and by how much, the largest
errors with their indices, whether the errors fill whole columns or rows (a store mask off by a dimension, a wrong
stride), where the output was left 0 (never written), and a small slice of output beside reference.

Outputs can be many GB: the report reads them a chunk of about COMPARE_CHUNK elements at a time and keeps only
bounded summaries (a few indices, MAX_RANGES ranges, one flag per column), whatever the output's size."""
from __future__ import annotations

import logging
import math
from typing import Any, Callable, Sequence

import torch

from kernelevolve.evaluate import checks
from kernelevolve.evaluate.checks import Widening, compared_as, exact_per_output, judged_as, outside_tolerance, tolerance

log = logging.getLogger(__name__)

LARGEST = 5  # largest errors listed
SPECIAL = 5  # positions listed where NaN or Inf differ
MAX_RANGES = 16  # ranges of rows (or columns) kept; more are only counted
NAMED_RANGES = 4  # ranges a summary names before it calls the errors scattered
MAX_COLUMNS = 1 << 24  # one flag per column up to this many (16 MB); longer rows are read as flat elements
SLICE_ROWS, SLICE_COLS = 4, 6
FULL = 0.9  # the share of a region's elements that makes it a whole region of errors
Exact = Callable[[], tuple[torch.Tensor, ...] | None] | None


def mismatch_report(ref: tuple[torch.Tensor, ...], out: tuple[Any, ...], allow_tf32: bool = False,
                    atol: float | None = None, rtol: float | None = None, exact: Exact = None,
                    rounded_in: Sequence[str] = ()) -> dict[str, Any] | None:
    """A JSON-serialisable account of the first output that differs from its reference, judged as compare_outputs
    judges it (same arguments). None when every output matches, or where the outputs differ in number, type, shape
    or dtype: compare_outputs's reason says all there is to say about those."""
    exact_at = exact_per_output(exact)
    if len(out) != len(ref):
        return None
    for i, (r, o) in enumerate(zip(ref, out)):
        if type(o) is not torch.Tensor or o.shape != r.shape or o.dtype != r.dtype:
            return None
        tol = tolerance(judged_as(r.dtype, rounded_in, i), allow_tf32, atol, rtol)
        report = _Scan(r, o, *tol, lambda i=i: exact_at(i)).run()
        if report is not None:
            return {"output": i, "outputs": len(ref), **report}
    return None


def mismatch_details(ref: tuple[torch.Tensor, ...], out: tuple[Any, ...], allow_tf32: bool = False,
                     atol: float | None = None, rtol: float | None = None, exact: Exact = None,
                     rounded_in: Sequence[str] = ()) -> dict[str, Any]:
    """``{"mismatch": report}`` for the details of a failed comparison, or {} where there is none. The report only
    informs: a failure in making it is logged, and the verdict stands without it."""
    try:
        report = mismatch_report(ref, out, allow_tf32, atol, rtol, exact, rounded_in)
    except Exception as e:  # broad on purpose: nothing here may turn a candidate's verdict into the judge's failure
        log.debug("no mismatch report: %s: %s", type(e).__name__, e)
        return {}
    return {"mismatch": report} if report else {}


class _Scan:
    """One output against its reference, a chunk of whole rows at a time."""

    def __init__(self, ref: torch.Tensor, out: torch.Tensor, atol: float, rtol: float,
                 exact: Callable[[], torch.Tensor | None]):
        self.ref, self.out, self.atol, self.rtol = ref, out, atol, rtol
        self.r_all, self.o_all = ref.reshape(-1), out.reshape(-1)  # a copy where not contiguous: made once
        n = ref.numel()
        # rows x columns: columns the last dimension, rows the leading ones flattened
        self.cols = ref.shape[-1] if ref.dim() >= 2 and ref.shape[-1] else max(n, 1)
        self.rows = n // self.cols
        self.flat = ref.dim() < 2 or self.cols > MAX_COLUMNS  # footprints over runs of elements instead
        fp_cols = 1 if self.flat else self.cols
        self.wrong, self.zeros = _Footprint(fp_cols, ref.device), _Footprint(fp_cols, ref.device)
        self.widen = Widening(ref, exact, atol, rtol) if ref.dtype.is_floating_point else None
        self.largest: list[tuple[float, int, Any, Any]] = []
        self.special: list[int] = []
        self.counts = {"nan_ref": 0, "nan_out": 0, "inf_ref": 0, "inf_out": 0}
        self.outside, self.max_rel = 0, 0.0

    def run(self) -> dict[str, Any] | None:
        r_all, o_all, n = self.r_all, self.o_all, self.ref.numel()
        floating = self.ref.dtype.is_floating_point or self.ref.dtype.is_complex
        wide = compared_as(self.ref.dtype) if floating else torch.float64
        row = 1 if self.flat else self.cols
        chunk = max(1, checks.COMPARE_CHUNK // row) * row  # whole rows, so that a chunk views as [rows, cols]
        for a in range(0, n, chunk):
            b = min(a + chunk, n)
            r, o = r_all[a:b].to(wide), o_all[a:b].to(self.ref.device, wide)
            if floating:
                err, value = outside_tolerance(r, o, self.atol, self.rtol)
                if self.widen is not None and bool(value.any()):
                    value = self.widen.still_bad(r, o, value, a, b)
                special = self._special(r, o)
                wrong = value | special
            else:  # integers and bool must match exactly, compared before the cast
                value = wrong = r_all[a:b] != o_all[a:b].to(self.ref.device)
                err, special = (o - r).abs(), None
            self.wrong.add(a // row, wrong.view(-1, row))
            self.zeros.add(a // row, (wrong & (o == 0)).view(-1, row))
            if special is not None and len(self.special) < SPECIAL:
                self.special += [a + j for j in _first_true(special, SPECIAL - len(self.special))]
            self._values(a, r, err, value)
        return self._report() if self.wrong.count else None

    def _special(self, r: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        nr, no, ir, io = torch.isnan(r), torch.isnan(o), torch.isinf(r), torch.isinf(o)
        for key, mask in (("nan_ref", nr), ("nan_out", no), ("inf_ref", ir), ("inf_out", io)):
            self.counts[key] += int(mask.sum())
        # where either side is NaN or Inf, both must be NaN, or the same infinity
        return (nr | no | ir | io) & ~((nr & no) | (r == o))

    def _values(self, a: int, r: torch.Tensor, err: torch.Tensor, value: torch.Tensor) -> None:
        k = int(value.sum())
        if not k:
            return
        self.outside += k
        vals, idx = torch.topk(torch.where(value, err, torch.full_like(err, -1.0)), min(LARGEST, k))
        # the values as the output's own dtype holds them: an integer stays 7, not 7.0
        self.largest += [(v, a + j, self.o_all[a + j].item(), self.r_all[a + j].item())
                         for v, j in zip(vals.tolist(), idx.tolist())]
        self.largest = sorted(self.largest, key=lambda t: (-t[0], t[1]))[:LARGEST]
        rel = torch.where(value, err / r.abs(), torch.zeros_like(err))  # an error beside a zero reference: inf
        self.max_rel = max(self.max_rel, float(rel.max()))

    def _report(self) -> dict[str, Any]:
        n = self.ref.numel()
        report: dict[str, Any] = {
            "shape": list(self.ref.shape), "dtype": str(self.ref.dtype).removeprefix("torch."),
            "atol": self.atol, "rtol": self.rtol,
            "ref_own_error": _num(self.widen.own) if self.widen is not None and self.widen.used else None,
            "elements": n, "wrong": self.wrong.count, "wrong_share": round(self.wrong.count / n, 6),
            "outside_tolerance": self.outside,
            "max_abs_err": _num(self.largest[0][0]) if self.largest else None,
            "max_rel_err": _num(self.max_rel) if self.largest else None,
            "largest": [{"index": self._index(j), "out": _num(o), "ref": _num(r), "abs_err": _num(e)}
                        for e, j, o, r in self.largest],
            "nan": {"ref": self.counts["nan_ref"], "out": self.counts["nan_out"]},
            "inf": {"ref": self.counts["inf_ref"], "out": self.counts["inf_out"]},
            "nan_inf_differs": [self._element(j) for j in self.special],
            "layout": None if self.ref.dim() < 2 else {"rows": self.rows, "columns": self.cols},
            "where": self._footprint(self.wrong, " wrong"),
            "zeros": self._footprint(self.zeros, "") if self.zeros.count else None,
            "slice": self._slice(self.wrong.first),
        }
        if report["zeros"] is not None:
            report["zeros"]["never_written"] = 2 * self.zeros.count >= self.wrong.count
        return report

    def _index(self, flat: int) -> list[int]:
        return [int(i) for i in torch.unravel_index(torch.tensor(flat), self.ref.shape)] if self.ref.dim() else []

    def _element(self, flat: int) -> dict[str, Any]:
        return {"index": self._index(flat), "out": _num(self.o_all[flat].item()), "ref": _num(self.r_all[flat].item())}

    def _footprint(self, fp: "_Footprint", wrong: str) -> dict[str, Any]:
        if self.flat:
            return {"count": fp.count, "elements": fp.ranges, "runs": fp.n_ranges,
                    "summary": _where_flat(fp, self.ref.numel())}
        cols, n_col_ranges = _ranges(fp.columns)
        return {"count": fp.count, "rows": fp.ranges, "n_rows": fp.n_rows, "columns": cols[:MAX_RANGES],
                "n_columns": int(fp.columns.sum()),
                "summary": _where(fp, self.rows, self.cols, cols, n_col_ranges, wrong)}

    def _slice(self, first: int) -> dict[str, Any]:
        """Up to SLICE_ROWS x SLICE_COLS elements of output and reference around the first wrong element."""
        rows, cols = (1, self.ref.numel()) if self.ref.dim() < 2 else (self.rows, self.cols)
        fr, fc = divmod(first, cols)
        r0, c0 = max(0, min(fr - 1, rows - SLICE_ROWS)), max(0, min(fc - 2, cols - SLICE_COLS))
        r1, c1 = min(rows, r0 + SLICE_ROWS), min(cols, c0 + SLICE_COLS)
        o_all, r_all = self.o_all, self.r_all
        take = [(i * cols + c0, i * cols + c1) for i in range(r0, r1)]
        return {"rows": None if self.ref.dim() < 2 else [r0, r1 - 1], "columns": [c0, c1 - 1],
                "first_wrong": self._index(first),
                "out": [[_num(v) for v in o_all[a:b].tolist()] for a, b in take],
                "ref": [[_num(v) for v in r_all[a:b].tolist()] for a, b in take]}


class _Footprint:
    """Where a set of elements sits in a rows x columns view, fed chunks of whole rows in order: how many, which
    rows (as ranges: rows arrive in order, so only the last range can grow) and which columns (one flag each)."""

    def __init__(self, cols: int, device: torch.device):
        self.cols, self.count, self.n_rows, self.first = cols, 0, 0, -1
        self.ranges: list[list[int]] = []  # the first MAX_RANGES ranges of rows, [first, last]
        self.n_ranges, self.tail = 0, -2  # all ranges; the last row of the last chunk, when it was flagged
        self.last = -1  # the last row flagged
        self.columns = torch.zeros(cols, dtype=torch.bool, device=device)

    def add(self, row0: int, m: torch.Tensor) -> None:
        """``m``: a chunk's flags as [rows, cols], its first row being ``row0``."""
        k = int(m.sum())
        if not k:
            self.tail = -2
            return
        self.count += k
        rows = m.any(1)
        self.n_rows += int(rows.sum())
        self.columns |= m.any(0)
        if self.first < 0:
            r = _first_true(rows, 1)[0]
            self.first = (row0 + r) * self.cols + _first_true(m[r], 1)[0]
        ranges, n = _ranges(rows)
        if ranges[0][0] == 0 and self.tail == row0 - 1:  # continues the last range of the previous chunk
            if self.n_ranges == len(self.ranges):
                self.ranges[-1][1] = row0 + ranges[0][1]
            ranges, n = ranges[1:], n - 1
        self.ranges += [[row0 + a, row0 + b] for a, b in ranges[:max(0, MAX_RANGES - len(self.ranges))]]
        self.n_ranges += n
        self.tail = row0 + rows.numel() - 1 if bool(rows[-1]) else -2
        self.last = row0 + rows.numel() - 1 - _first_true(rows.flip(0), 1)[0]


def _first_true(mask: torch.Tensor, k: int, block: int = 1 << 20) -> list[int]:
    """The indices of the first ``k`` True elements of a 1-D ``mask``, a block at a time: a mask with millions of
    True elements never becomes millions of indices."""
    found: list[int] = []
    for a in range(0, mask.numel(), block):
        found += [a + int(i) for i in torch.nonzero(mask[a:a + block]).flatten()[:k - len(found)]]
        if len(found) >= k:
            break
    return found


def _ranges(mask: torch.Tensor) -> tuple[list[list[int]], int]:
    """The first MAX_RANGES + 1 runs of True in a 1-D ``mask`` as [first, last], and how many runs there are."""
    off = mask.new_zeros(1)
    starts, ends = mask & ~torch.cat([off, mask[:-1]]), mask & ~torch.cat([mask[1:], off])
    pairs = zip(_first_true(starts, MAX_RANGES + 1), _first_true(ends, MAX_RANGES + 1))
    return [[a, b] for a, b in pairs], int(starts.sum())


def spans(ranges: list[list[int]], total: int) -> str:
    """Ranges as ``0-3, 8, 16-31``; the ones past NAMED_RANGES counted."""
    text = ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in ranges[:NAMED_RANGES])
    return text + (f" and {total - NAMED_RANGES} more" if total > NAMED_RANGES else "")


def _where(fp: _Footprint, rows: int, cols: int, col_ranges: list[list[int]], n_col_ranges: int, wrong: str) -> str:
    """The shape of a footprint in words: whole columns, whole rows, a block, or scattered. Nearly whole counts as
    whole: a never-written region still holds the few elements whose reference is within the tolerance of 0."""
    k, nr, nc = fp.count, fp.n_rows, int(fp.columns.sum())
    rs = _region("row", fp.ranges, fp.n_ranges, nr, fp.last, rows)
    cs = _region("column", col_ranges, n_col_ranges, nc, cols - 1 - _first_true(fp.columns.flip(0), 1)[0], cols)

    def whole(area: int) -> bool:
        return k >= FULL * area

    def part(area: int) -> str:
        return "" if k == area else f" ({k} of {area} elements)"

    if k == 1:
        return "a single element: row {}, column {}".format(*divmod(fp.first, cols))
    if whole(rows * cols):
        return f"every element{wrong}{part(rows * cols)}"
    if nr == rows and cs and whole(rows * nc):
        return f"{cs} of {cols}{wrong} in every row{part(rows * nc)}"
    if nc == cols and rs and whole(nr * cols):
        return f"{rs} of {rows}{wrong} in every column{part(nr * cols)}"
    if rs and cs and whole(nr * nc):
        return f"a block: {rs} of {rows} x {cs} of {cols}{wrong}{part(nr * nc)}"
    if cs and nc < cols:
        return f"{cs} of {cols}: {k} elements in {nr} of {rows} rows"
    if rs and nr < rows:
        return f"{rs} of {rows}: {k} elements in {nc} of {cols} columns"
    return f"scattered: {k} elements in {nr} rows and {nc} columns"


def _region(noun: str, ranges: list[list[int]], n_ranges: int, count: int, last: int, total: int) -> str | None:
    """Rows or columns by name where they form a few ranges; by the span they lie in where that is narrow (a
    never-written region with holes where the reference is 0 too); else None."""
    if n_ranges <= NAMED_RANGES:
        return _named(noun, ranges, n_ranges)
    first = ranges[0][0]
    return f"{count} {noun}s within {first}-{last}" if last - first + 1 <= total // 2 else None


def _named(noun: str, ranges: list[list[int]], total: int) -> str:
    single = total == 1 and ranges[0][0] == ranges[0][1]
    return f"{noun}{'' if single else 's'} {spans(ranges, total)}"


def _where_flat(fp: _Footprint, n: int) -> str:
    if fp.count == n:
        return "every element"
    if fp.n_ranges <= NAMED_RANGES:
        return f"{_named('element', fp.ranges, fp.n_ranges)} of {n}"
    return f"scattered: {fp.count} elements in {fp.n_ranges} runs"


def _num(x: Any) -> Any:
    """A value as JSON holds it: 6 significant digits; NaN, Inf and complex values as text."""
    if isinstance(x, (bool, int)):
        return x
    if isinstance(x, complex):
        return str(x)
    x = float(x)
    return float(f"{x:.6g}") if math.isfinite(x) else str(x)
