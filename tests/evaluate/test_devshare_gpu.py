"""Outputs handed over on the device by CUDA IPC: a round trip between two processes, and handles that must fail."""
from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from kernelevolve.evaluate import devshare

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _exporter(conn, n: int, claim: int) -> None:
    torch.manual_seed(n)
    t = torch.randn(n, device="cuda")
    ex = devshare.Exporter()
    spec = ex.export([t])[0]
    conn.send((dict(spec, bytes=claim or spec["bytes"]), t.cpu()))
    conn.recv()  # the parent is done
    ex.release()


def _share(n: int, claim: int = 0):
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_exporter, args=(child, n, claim))
    proc.start()
    try:
        spec, expected = parent.recv()
        try:
            got = devshare.import_bytes(spec, torch.device("cuda:0"))
        finally:
            parent.send(b"done")
        return got, expected
    finally:
        proc.join(60)


def test_round_trip_between_processes():
    got, expected = _share(3 << 20)
    assert got.device.type == "cuda"
    assert torch.equal(got.view(torch.float32).cpu(), expected)


def test_a_claim_larger_than_the_allocation_is_refused():
    with pytest.raises(devshare.DeviceShareError, match="shared allocation"):
        _share(1 << 10, claim=1 << 30)


def test_a_forged_handle_is_refused():
    with pytest.raises(devshare.DeviceShareError):
        devshare.import_bytes({"handle": "ab" * devshare.HANDLE_SIZE, "bytes": 16}, torch.device("cuda:0"))
    with pytest.raises(devshare.DeviceShareError, match="malformed"):
        devshare.import_bytes({"handle": "ab", "bytes": 16}, torch.device("cuda:0"))
