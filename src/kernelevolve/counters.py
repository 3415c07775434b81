"""Hardware counters of a problem's kernels, read with Nsight Compute (``ncu``), and the bound each kernel names.

``diagnose`` runs the reference, or a candidate with the reference's weights, once after a warm-up, in a child
process started the way the judge starts candidates (its own process group, a hard deadline, a scrubbed
environment), with ncu around it: ``--clock-control none`` (the card's clocks are left as they are), counters for the
one profiled call only (``--profile-from-start off``). Per kernel it reads the duration, DRAM and SM throughput as
shares of peak, the tensor pipes' activity, achieved occupancy, registers, local-memory traffic (spills), the L2 hit
rate and the warp-stall reasons, and names the bound in one line: memory, compute, latency, occupancy or launch.
Where ncu is missing or the counters cannot be read, ``CountersError`` says why in one line.

``python -m kernelevolve.counters --target PROBLEM [--candidate FILE] [--device D]`` is the child itself.
"""
from __future__ import annotations

import argparse
import csv
import io
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any

NCU_TIMEOUT_S = 600.0
BASE_METRICS = ("gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                "sm__throughput.avg.pct_of_peak_sustained_elapsed", "sm__warps_active.avg.pct_of_peak_sustained_active",
                "launch__registers_per_thread", "lts__t_sector_hit_rate.pct",
                "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum")
# Hopper's warpgroup MMA (wgmma) runs on a pipe of its own; mma.sync (small Triton tiles, sm80 cuBLAS kernels) on the
# hmma pipe, the only one earlier chips have: the busier of the two is the tensor pipes' share
TENSOR_METRICS = {9: ("sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
                      "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active")}
TENSOR_DEFAULT = ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",)
STALLS = ("long_scoreboard", "short_scoreboard", "wait", "barrier", "mio_throttle", "lg_throttle",
          "math_pipe_throttle", "not_selected", "dispatch_stall", "no_instruction", "membar", "branch_resolving",
          "tex_throttle", "drain", "sleeping", "imc_miss", "misc")
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
BOUNDS = ("memory", "compute", "latency", "occupancy", "launch")
LAUNCH_US = 5.0  # a kernel this short is dominated by its launch and its ramp, whatever its counters say
HIGH_PCT = 60.0  # a unit this busy bounds the kernel
LOW_OCCUPANCY_PCT = 25.0


class CountersError(Exception):
    """The counters cannot be read: no ncu, no permission, a target that failed (one line)."""


@dataclass(frozen=True)
class KernelCounters:
    name: str
    duration_us: float | None
    dram_pct: float | None
    sm_pct: float | None
    tensor_pct: float | None
    occupancy_pct: float | None
    registers: int | None
    spill_bytes: float | None  # local-memory bytes loaded and stored
    l2_hit_pct: float | None
    stalls: tuple[tuple[str, float], ...]  # the top reasons: cycles per issued instruction
    bound: str  # memory | compute | latency | occupancy | launch
    why: str  # one line

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def ncu_path() -> str | None:
    return shutil.which("ncu")


def metrics_for(major: int | None) -> list[str]:
    return [*BASE_METRICS, *TENSOR_METRICS.get(major or 0, TENSOR_DEFAULT), *(STALL_METRIC.format(s) for s in STALLS)]


def diagnose(problem_path: str, device: str = "cuda", candidate_path: str | None = None,
             timeout_s: float = NCU_TIMEOUT_S, ncu: str | None = None, major: int | None = None) -> list[KernelCounters]:
    """The counters of each kernel of one call of the reference (or of ``candidate_path``). A metric this chip or
    this ncu does not know is dropped and the collection tried again."""
    from kernelevolve.evaluate.checks import scrub_environment

    ncu = ncu or ncu_path()
    if ncu is None:
        raise CountersError("ncu is not on the PATH: no hardware counters (the torch profiler's profile stands)")
    metrics = metrics_for(major)
    target = [sys.executable, "-m", "kernelevolve.counters", "--target", str(problem_path), "--device", device]
    if candidate_path:
        target += ["--candidate", str(candidate_path)]
    for _ in range(3):
        cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--target-processes", "all", "--csv",
               "--page", "raw", "--print-units", "base", "--metrics", ",".join(metrics), *target]
        out, err, code = _run(cmd, scrub_environment(dict(os.environ)), timeout_s)
        # every metric ncu names as unknown goes at once (by its full name, or by its base before the rollup)
        named = set(re.findall(r"[\w]+__[\w.]+", " ".join(line for line in (out + err).splitlines()
                                                           if "ailed to find metric" in line)))
        unknown = [m for m in metrics if m in named or m.split(".")[0] in named]
        if not unknown:
            break
        metrics = [m for m in metrics if m not in unknown]
    if "ERR_NVGPUCTRPERM" in out + err:
        raise CountersError("the GPU's performance counters are not readable by this user (ERR_NVGPUCTRPERM)")
    rows = parse_raw_csv(out)
    if code != 0 and not rows:
        tail = [line for line in (err or out).strip().splitlines() if line.strip()][-1:] or [f"exit code {code}"]
        raise CountersError(f"ncu failed: {tail[0][:300]}")
    if not rows:
        raise CountersError("ncu profiled no kernel (the call ran none, or it ran on the CPU)")
    return [kernel_counters(r) for r in rows]


def _run(cmd: list[str], env: dict[str, str], timeout_s: float) -> tuple[str, str, int]:
    """``cmd`` in a process group of its own, killed whole past ``timeout_s``."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # it ended just then
            pass
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        raise CountersError(f"ncu did not finish within {timeout_s:g} s; its process group was killed") from None
    return out, err, proc.returncode


def _number(text: str | None) -> float | None:
    try:
        return float(str(text).strip().replace(",", ""))
    except (TypeError, ValueError):
        return None


def parse_raw_csv(text: str) -> list[dict[str, Any]]:
    """The rows of ``ncu --csv --page raw`` (after its ``==PROF==`` banners and the target's own output): a header,
    a units row, then one row per kernel launch; numbers scaled to ns for times where a unit says otherwise."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    reader = csv.reader(io.StringIO("\n".join(line for line in lines[start:] if line.startswith('"'))))
    header = next(reader, [])
    rows = [r for r in reader if len(r) == len(header)]
    units: dict[str, str] = {}
    if rows and not rows[0][header.index("ID")].strip():
        units = dict(zip(header, rows.pop(0)))
    scale = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9,
             "s": 1e9}
    out = []
    for r in rows:
        row: dict[str, Any] = {"name": r[header.index("Kernel Name")] if "Kernel Name" in header else "?"}
        for col, raw in zip(header, r):
            if "__" in col:
                v = _number(raw)
                if v is not None and col == "gpu__time_duration.sum":
                    v *= scale.get(units.get(col, "nsecond").strip(), 1.0)
                row[col] = v
        out.append(row)
    return out


def kernel_counters(row: dict[str, Any]) -> KernelCounters:
    ns = row.get("gpu__time_duration.sum")
    tensor = max((v for k, v in row.items() if k.startswith("sm__pipe_tensor_op") and v is not None), default=None)
    spills = [row.get(f"l1tex__t_bytes_pipe_lsu_mem_local_op_{x}.sum") for x in ("ld", "st")]
    stalls = sorted(((s, row[STALL_METRIC.format(s)]) for s in STALLS if row.get(STALL_METRIC.format(s))),
                    key=lambda p: -p[1])[:3]
    regs = row.get("launch__registers_per_thread")
    k = dict(name=_short(row["name"]), duration_us=None if ns is None else ns / 1e3,
             dram_pct=row.get("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
             sm_pct=row.get("sm__throughput.avg.pct_of_peak_sustained_elapsed"), tensor_pct=tensor,
             occupancy_pct=row.get("sm__warps_active.avg.pct_of_peak_sustained_active"),
             registers=None if regs is None else int(regs),
             spill_bytes=None if all(s is None for s in spills) else sum(s or 0.0 for s in spills),
             l2_hit_pct=row.get("lts__t_sector_hit_rate.pct"), stalls=tuple(stalls))
    bound, why = classify(k)
    return KernelCounters(**k, bound=bound, why=why)


def classify(k: dict[str, Any]) -> tuple[str, str]:
    """The bound a kernel's counters name, and the one line that says so."""
    dram, sm, tensor = k["dram_pct"] or 0.0, k["sm_pct"] or 0.0, k["tensor_pct"] or 0.0
    occ, us = k["occupancy_pct"], k["duration_us"]
    stalls = ", ".join(f"{s} {v:.1f}" for s, v in k["stalls"])
    facts = f"DRAM {dram:.0f}% of peak, SM {sm:.0f}%, tensor pipes {tensor:.0f}%" + (
        f", occupancy {occ:.0f}%" if occ is not None else "") + (f"; top stalls: {stalls}" if stalls else "")
    if us is not None and us < LAUNCH_US and max(dram, sm) < HIGH_PCT:
        return "launch", f"launch-bound: {us:.1f} us, too short for its counters to matter ({facts})"
    if dram >= HIGH_PCT and dram >= max(sm, tensor):
        return "memory", f"memory-bound: {facts}"
    if max(sm, tensor) >= HIGH_PCT:
        return "compute", f"compute-bound: {facts}"
    if occ is not None and occ < LOW_OCCUPANCY_PCT:
        spill = f", {k['spill_bytes']:.0f} B of spills" if k.get("spill_bytes") else ""
        return "occupancy", f"occupancy-limited: {k.get('registers')} registers a thread{spill} ({facts})"
    return "latency", f"latency-bound: no unit near its peak ({facts})"


def _short(name: str, limit: int = 60) -> str:
    """A kernel's name without its template arguments and parameters (cuBLAS and CUTLASS names run to hundreds)."""
    base = re.sub(r"<.*", "", re.sub(r"\(.*", "", name)).strip().split(" ")[-1] or name
    return base if len(base) <= limit else base[:limit - 1] + "…"


def render(kernels: list[KernelCounters]) -> str:
    """A text table, the slowest kernels first, and each kernel's one-line bound."""
    head = f"{'kernel':<44} {'us':>9} {'DRAM%':>6} {'SM%':>5} {'TC%':>5} {'occ%':>5} {'regs':>5} {'spill':>6} {'L2%':>5}"
    lines = [head]
    fmt = lambda v, spec: "—" if v is None else format(v, spec)  # noqa: E731
    for k in sorted(kernels, key=lambda k: -(k.duration_us or 0.0)):
        lines.append(f"{k.name[:44]:<44} {fmt(k.duration_us, '.2f'):>9} {fmt(k.dram_pct, '.0f'):>6} "
                     f"{fmt(k.sm_pct, '.0f'):>5} {fmt(k.tensor_pct, '.0f'):>5} {fmt(k.occupancy_pct, '.0f'):>5} "
                     f"{fmt(k.registers, 'd'):>5} {fmt(k.spill_bytes, '.0f'):>6} {fmt(k.l2_hit_pct, '.0f'):>5}")
        lines.append(f"  {k.why}")
    return "\n".join(lines)


# --- the child ncu profiles -------------------------------------------------------------------------------------------
def _target(args: argparse.Namespace) -> int:
    import torch

    from kernelevolve.problem import build_model, import_module_from_path, make_inputs

    module = import_module_from_path(args.target, "_ke_counters_problem")
    tf32 = bool(getattr(module, "ALLOW_TF32", False))  # as the judge sets it: the same cuBLAS kernels are profiled
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    model = build_model(module, "Model", 0)
    if args.candidate:
        cand = import_module_from_path(args.candidate, "_ke_counters_candidate")
        new = cand.ModelNew(*module.get_init_inputs())
        if set(new.state_dict()) == set(model.state_dict()):
            new.load_state_dict(model.state_dict())
        model = new
    model = model.to(args.device)  # in its constructed mode, as the judge runs it
    inputs = make_inputs(module, 1234, 0, args.device)
    cuda = args.device.startswith("cuda")
    with torch.no_grad():
        for _ in range(3):  # compile, autotune and warm up outside the profiled call
            model(*inputs)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
        model(*inputs)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="the process ncu profiles: one call of the reference or a candidate")
    ap.add_argument("--target", required=True, help="the problem file")
    ap.add_argument("--candidate", help="a candidate file, given the reference's weights")
    ap.add_argument("--device", default="cuda")
    return _target(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
