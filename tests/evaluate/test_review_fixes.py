"""Regression tests for bugs found in review: protocol, deadlines, leaks, forged messages, RNG races, comparisons."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from kernelevolve.candidate import Candidate
from kernelevolve.evaluate import Result, Status, Timing, process
from kernelevolve.evaluate.checks import compare_outputs
from kernelevolve.evaluate.evaluator import Evaluator
from kernelevolve.evaluate.result import Baseline
from kernelevolve.evaluate.worker import Channel, _encode, visible_device
from kernelevolve.problem import load_problem

ROOT = Path(__file__).resolve().parents[2]
CHEATS = ROOT / "tests" / "cheats"

_MODEL = '''
class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x):
        return torch.relu(x * self.scale + self.bias)
'''
# The candidate runs in the child, which holds its end of the result channel: it can find and write to it.
_CHANNEL = '''
import gc, json, os, struct
import multiprocessing.connection
import torch
import torch.nn as nn

CONN = next(o for o in gc.get_objects() if isinstance(o, multiprocessing.connection.Connection))
'''


# --- process.py -------------------------------------------------------------------------------------------------------
def test_tampering_found_after_timing_is_rejected_even_once_the_child_has_exited(new_evaluator, monkeypatch):
    """The child reports tampering during timing after its last timing reply, then exits. When the parent's next
    command finds the channel closed, the waiting answer still decides: rejected, not crashed."""
    source = '''
import sys, time
import torch
import torch.nn as nn


def _being_timed():
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in ("_time_cpu", "_time_cuda"):
            return True
        frame = frame.f_back
    return False
''' + _MODEL.replace("        return torch.relu", '''        if _being_timed() and not hasattr(time, "_real"):
            time._real = time.perf_counter
            time.perf_counter = lambda: time._real()
        return torch.relu''')
    original = Evaluator._check_timed_outputs

    def slow(self, *args):  # give the child time to exit before the post-timing check is sent
        time.sleep(1.0)
        return original(self, *args)

    monkeypatch.setattr(Evaluator, "_check_timed_outputs", slow)
    r = new_evaluator("problem_scale.py").evaluate(Candidate(source))
    assert r.status is Status.REJECTED, (r.reason, r.error)
    assert "after timing: time.perf_counter" in r.reason


def test_a_half_sent_frame_cannot_hold_the_parent_past_the_deadline(new_evaluator):
    source = _CHANNEL + "os.write(CONN.fileno(), struct.pack('!i', 1 << 20))\n" + _MODEL
    ev = new_evaluator("problem_scale.py", timeout_s=3.0, time_candidates=False)
    out: list[Result] = []
    worker = threading.Thread(target=lambda: out.append(ev.evaluate(Candidate(source))), daemon=True)
    worker.start()
    worker.join(30.0)
    assert out, "evaluate() still blocked 30 s after a 3 s deadline"
    assert out[0].status is Status.TIMEOUT, (out[0].reason, out[0].error)


def test_a_fifo_in_the_blob_folder_is_not_read(tmp_path):
    child = process.Child.__new__(process.Child)
    child.blob_dir = str(tmp_path)
    os.mkfifo(tmp_path / "1-1.bin")
    out: list[bytearray] = []
    reader = threading.Thread(target=lambda: out.append(child._read_blob({"blob_file": "1-1.bin", "blob_bytes": 4})),
                              daemon=True)
    reader.start()
    reader.join(5.0)
    assert out == [bytearray()], "the parent blocked opening a FIFO planted in the blob folder"


def test_a_failed_start_leaves_no_blob_folder(monkeypatch):
    def broken() -> None:
        raise OSError("no fork server")

    made: list[str] = []
    blob_dir = process._blob_dir
    monkeypatch.setattr(process, "_blob_dir", lambda: made.append(blob_dir()) or made[-1])
    monkeypatch.setattr(process, "context", broken)
    with pytest.raises(OSError):
        process.Child({"log": os.devnull}, 5.0)
    assert made and made[0] and not os.path.exists(made[0])


# --- evaluator.py: messages forged by the candidate on its channel ------------------------------------------------------
def test_a_failure_forged_with_status_ok_is_rejected(scale_evaluator):
    forge = {"msg": "fail", "status": "ok", "reason": "verified"}
    source = _CHANNEL + f"CONN.send_bytes(json.dumps({forge!r}).encode() + b'\\n')\n" + _MODEL
    r = scale_evaluator.evaluate(Candidate(source))
    assert r.status is Status.REJECTED, (r.reason, r.error)


def test_a_malformed_message_is_a_result_not_an_exception(scale_evaluator):
    source = _CHANNEL + "CONN.send_bytes(b'{\"msg\": \"loaded\"}\\n')\n" + _MODEL
    r = scale_evaluator.evaluate(Candidate(source))
    assert r.status is Status.REJECTED, (r.reason, r.error)
    assert "malformed" in r.reason


def test_baseline_error_names_a_timeout(new_evaluator):
    b = new_evaluator("problem_scale.py", timeout_s=0.001).baseline(compiled=False)
    assert b.eager is None
    assert "ChildTimeout" in b.error, b.error


# --- the reference in the parent --------------------------------------------------------------------------------------
def test_reference_sets_cudnn_tf32_like_the_child(scale_evaluator):
    saved = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True  # PyTorch's default
        scale_evaluator.reference(1)
        assert torch.backends.cudnn.allow_tf32 is scale_evaluator.problem.allow_tf32 is False
    finally:
        torch.backends.cudnn.allow_tf32 = saved


def test_concurrent_references_draw_their_own_seeds(tmp_path):
    problem = tmp_path / "problem_many.py"
    problem.write_text((CHEATS / "problem_scale.py").read_text().replace(
        "return [torch.randn(64, DIM)]", "return [sum(torch.randn(64, DIM) for _ in range(40)) / 40]"))
    from kernelevolve.evaluate import EvalConfig

    ev = Evaluator(load_problem(problem), EvalConfig(device="cpu"), tmp_path / "work")
    seeds = list(range(1, 9))
    expected = {s: ev.reference(s)[0] for s in seeds}
    wrong: list[int] = []

    def draw(seed: int) -> None:
        for _ in range(20):
            if not torch.equal(ev.reference(seed)[0], expected[seed]):
                wrong.append(seed)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=draw, args=(s,)) for s in seeds]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not wrong, f"{len(wrong)} references computed from another thread's seed"


# --- worker.py --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gpu, inherited, expected", [
    (1, None, "1"), (1, "", "1"), (0, "2,3", "2"), (1, "2, 3", "3"), (1, "GPU-aaa,GPU-bbb", "GPU-bbb"), (2, "4", "2"),
])
def test_visible_device_maps_through_the_inherited_list(gpu, inherited, expected):
    assert visible_device(gpu, inherited) == expected


_PINNED = """
import os, sys
from kernelevolve.candidate import Candidate
from kernelevolve.evaluate import EvalConfig, Evaluator
from kernelevolve.problem import load_problem

if __name__ == "__main__":
    ev = Evaluator(load_problem(sys.argv[1]), EvalConfig(device="cpu", timeout_s=60, time_candidates=False), sys.argv[2])
    r = ev.evaluate(Candidate("import os\\nraise RuntimeError('CVD=' + os.environ['CUDA_VISIBLE_DEVICES'])\\n"), gpu=1)
    print(r.reason)
"""


def test_child_is_pinned_within_the_parents_visible_devices(tmp_path):
    """Worker 1 of a parent started with CUDA_VISIBLE_DEVICES=7,5 is the machine's GPU 5, not its GPU 1."""
    script = tmp_path / "pinned.py"
    script.write_text(_PINNED)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="7,5",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(script), str(CHEATS / "problem_scale.py"), str(tmp_path / "work")],
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CVD=5" in proc.stdout, proc.stdout


class _Conn:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send_bytes(self, data: bytes) -> None:
        self.sent.append(data)


def test_large_blob_falls_back_to_the_pipe_when_the_file_cannot_be_written(tmp_path):
    conn = _Conn()
    blob = bytes(range(256)) * (Channel.FILE_MIN_BYTES // 256 + 1)
    Channel(conn, str(tmp_path / "missing")).send({"msg": "output"}, blob)
    header, _, payload = conn.sent[0].partition(b"\n")
    assert json.loads(header) == {"msg": "output"} and payload == blob


def test_conjugate_views_can_be_sent():
    x = torch.randn(5, dtype=torch.complex64)
    for view in (x.conj(), x.conj().imag):  # a conjugate bit; a negative bit
        meta, [raw] = _encode([view])
        resolved = view.resolve_conj().resolve_neg()
        assert meta == [{"dtype": str(view.dtype).removeprefix("torch."), "shape": [5]}]
        assert bytes(raw) == resolved.contiguous().view(torch.uint8).numpy().tobytes()


# --- checks.py and result.py ------------------------------------------------------------------------------------------
def test_complex_outputs_are_compared_on_both_parts():
    ref = torch.randn(16, dtype=torch.complex64)
    out = ref.clone()
    out.imag += 1.0
    assert compare_outputs((ref,), (out,)) is not None
    assert compare_outputs((ref,), (ref.clone(),)) is None


def test_zero_median_gives_no_speedup_instead_of_dividing_by_zero():
    r = Result(Status.OK, "verified", timing=Timing.from_samples([0.0, 0.0, 0.0], "cuda-events"), timed=True)
    eager = Timing.from_samples([1.0], "cuda-events")
    out = r.with_baseline(Baseline("cuda", eager, eager))
    assert out.speedup_eager is None and out.speedup_compile is None
