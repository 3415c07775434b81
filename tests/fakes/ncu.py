#!/usr/bin/env python3
"""A stand-in for Nsight Compute's ``ncu`` in the CPU tests: it checks the options the project passes, runs the
target command as ncu would (so the target itself is exercised), and prints a raw CSV page of two kernels, with the
metrics it was asked for. FAKE_NCU_MODE: "ok" (default), "perm" (counters not readable), "unknown-metric" (refuses
the tensor-pipe metric once), "hang". FAKE_NCU_RUN_TARGET=0: the target is not run (a CUDA target on the CPU)."""
import os
import subprocess
import sys
import time

args = sys.argv[1:]
opts, i = {}, 0
while i < len(args) and args[i].startswith("--"):
    if args[i] == "--csv":  # a flag; every other option takes a value
        opts[args[i]], i = True, i + 1
        continue
    opts[args[i]] = args[i + 1]
    i += 2
target = args[i:]
mode = os.environ.get("FAKE_NCU_MODE", "ok")
leaked = [k for k in os.environ if any(w in k.upper() for w in ("KEY", "TOKEN", "SECRET"))]
if leaked:  # ncu and its target run with the judge's scrubbed environment
    print(f"==ERROR== secrets reached the profiler: {leaked}", file=sys.stderr)
    sys.exit(5)
assert opts["--clock-control"] == "none" and opts["--profile-from-start"] == "off", opts
assert opts["--page"] == "raw" and opts["--csv"] and opts["--print-units"] == "base", opts
metrics = opts["--metrics"].split(",")
if mode == "hang":
    time.sleep(60)
if mode == "perm":
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters")
    sys.exit(1)
if mode == "unknown-metric" and any(m.startswith("sm__pipe_tensor_op") for m in metrics):
    for bad in (m for m in metrics if m.startswith("sm__pipe_tensor_op")):  # each named, by its base name
        print(f'==ERROR== Failed to find metric {bad.split(".")[0]}')
    sys.exit(1)
run = subprocess.run(target if os.environ.get("FAKE_NCU_RUN_TARGET", "1") == "1" else ["true"], capture_output=True,
                     text=True)
if run.returncode != 0:
    print(run.stderr, file=sys.stderr)
    sys.exit(run.returncode)
print("==PROF== Connected to process 4242")
print("==PROF== Profiling \"kernel\": 0%....50%....100% - 9 passes")
meta = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size", "Grid Size",
        "Device", "CC"]
values = {"gpu__time_duration.sum": ("nsecond", ["812,345", "3,100"]),
          "dram__throughput.avg.pct_of_peak_sustained_elapsed": ("%", ["86.4", "2.0"]),
          "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("%", ["31.2", "3.1"]),
          "sm__warps_active.avg.pct_of_peak_sustained_active": ("%", ["71.0", "12.5"]),
          "launch__registers_per_thread": ("register/thread", ["40", "255"]),
          "lts__t_sector_hit_rate.pct": ("%", ["12.0", "90.1"]),
          "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum": ("byte", ["0", "4,096"]),
          "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum": ("byte", ["0", "4,096"]),
          "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": ("ratio", ["14.2", "0.5"]),
          "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": ("ratio", ["1.1", "3.0"])}
cols = [m for m in metrics]
q = lambda xs: ",".join(f'"{x}"' for x in xs)  # noqa: E731
print(q(meta + cols))
print(q([""] * len(meta) + [values.get(m, ("%", None))[0] for m in cols]))
names = ["void at::native::vectorized_elementwise_kernel<4, at::native::GeluFunctor<float>>(int, float*)",
         "k0_tiny_kernel"]
for k in range(2):
    row = [str(k), "4242", "python3", "host", names[k], "1", "7", "(128, 1, 1)", "(1024, 1, 1)", "0", "9.0"]
    print(q(row + [values[m][1][k] if m in values else ("" if "tensor" not in m else "0.0") for m in cols]))
