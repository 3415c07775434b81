"""The timing loop refills the same input buffers with new values before every call."""
import os
import time

import pytest
import torch

from kernelevolve.evaluate.timing import TimingConfig, measure, warm_up


def test_every_call_sees_new_values_in_the_same_buffers():
    sets = [[torch.full((8,), float(k))] for k in range(3)]
    seen = []

    def fn(x):
        seen.append((x.data_ptr(), x._version, float(x[0])))
        return x * 2

    cfg = TimingConfig(budget_ms=5, warmup_ms=1, min_reps=7, max_reps=7, flush=False)
    calls, reps = warm_up(fn, sets, "cpu", cfg)
    seen.clear()
    run = measure(fn, sets, "cpu", reps, cfg, calls, keep=[0, 4])
    assert len(seen) == reps == 7
    assert len({ptr for ptr, _, _ in seen}) == 1, "one buffer, reused"
    versions = [v for _, v, _ in seen]
    assert versions == sorted(set(versions)), "the version counter moves on every call"
    assert [val for _, _, val in seen] == [float(i % 3) for i in range(7)], "values rotate through the sets"
    assert [float(sets[k][0][0]) for k in range(3)] == [0.0, 1.0, 2.0], "the sets themselves are never touched"
    assert sorted(run.kept) == [0, 4]
    assert torch.equal(run.kept[4][0], torch.full((8,), 2.0)), "kept outputs are clones taken after the call"


def test_mutating_function_leaves_sets_pristine():
    sets = [[torch.ones(4)]]

    def fn(x):
        x.add_(1)
        return x

    cfg = TimingConfig(budget_ms=1, warmup_ms=1, min_reps=3, max_reps=3, flush=False)
    calls, reps = warm_up(fn, sets, "cpu", cfg)
    run = measure(fn, sets, "cpu", reps, cfg, calls, keep=[2])
    assert torch.equal(sets[0][0], torch.ones(4))
    assert torch.equal(run.kept[2][0], torch.full((4,), 2.0))


def test_the_hosts_launch_time_is_kept_for_every_repetition():
    """Per repetition, the host's time to return from the call: on the CPU the sample itself."""
    import time

    sets = [[torch.ones(4)]]

    def fn(x):
        time.sleep(0.002)
        return x + 1

    cfg = TimingConfig(budget_ms=1, warmup_ms=1, min_reps=4, max_reps=4, flush=False)
    calls, reps = warm_up(fn, sets, "cpu", cfg)
    run = measure(fn, sets, "cpu", reps, cfg, calls)
    assert len(run.host_ms) == reps == 4
    assert run.host_ms == run.samples_ms and min(run.host_ms) >= 2.0


def test_the_loop_records_what_else_the_cpu_did():
    """Processes burning every core while the loop runs show as busy cores, and as cores taken from the timing
    process: what explains a host's launch time that grew for no fault of the candidate."""
    import os
    import subprocess
    import sys

    from kernelevolve.evaluate.timing import cpu_share

    if not os.path.exists("/proc/stat"):
        pytest.skip("the machine's busy time comes from Linux's /proc/stat")
    sets = [[torch.ones(64)]]

    def fn(x):
        end = time.perf_counter() + 0.002  # on a core the whole time, like a launch loop
        while time.perf_counter() < end:
            pass
        return x + 1

    cfg = TimingConfig(budget_ms=1, warmup_ms=1, min_reps=150, max_reps=150, flush=False)
    cores = os.cpu_count() or 1
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores + 1)]
    try:
        time.sleep(0.3)
        run = measure(fn, sets, "cpu", 150, cfg)
    finally:
        for p in burners:
            p.kill()
            p.wait()
    assert run.cpu["busy_cores"] >= 0.75 * cores, run.cpu
    assert run.cpu["preempted"] > 0 and run.cpu["self_cpu"] < 0.95, run.cpu
    assert cpu_share(None, (1.0, 0.0, 1.0, 2.0), 1.0) == {}


def test_busy_cores_never_reads_under_the_process_own_share():
    """A coarse /proc/stat can count no busy tick in a short loop while the loop kept a core busy."""
    from kernelevolve.evaluate.timing import cpu_share

    # (CPU seconds, switches, busy ticks, total ticks): 0.1 s of this process's CPU in 0.1 s, no busy tick counted
    share = cpu_share((5.0, 0.0, 100.0, 1000.0), (5.1, 0.0, 100.0, 1160.0), 0.1)
    assert share["self_cpu"] == 1.0 and share["busy_cores"] == 1.0
    busy = cpu_share((5.0, 0.0, 100.0, 1000.0), (5.1, 0.0, 260.0, 1160.0), 0.1)  # every tick busy
    assert busy["busy_cores"] == (os.cpu_count() or 1)
