"""Outputs handed from the evaluation child to the parent on the device itself, through CUDA IPC.

An output of gigabytes costs seconds on the host path (to host memory, through a file, back to the device) and is
paid at every trial. Here the child copies each output into device memory of its own, allocated apart from the
candidate's (so the candidate cannot change it afterwards), and sends an IPC handle; the parent opens it, checks that
the allocation holds what the header says, clones it into its own memory and closes it. The child frees its copies
only at the parent's next command, when the parent is done with them. The driver is reached through ctypes: no
build step, and nothing from the candidate is unpickled.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any

import torch

HANDLE_SIZE = 64
LAZY_ENABLE_PEER_ACCESS = 1
# Below this many bytes of outputs the host path costs milliseconds and is kept.
MIN_BYTES = 16 << 20


class DeviceShareError(Exception):
    pass


class _Handle(ctypes.Structure):
    # unsigned bytes: a c_char array reads back as bytes cut at the first NUL
    _fields_ = [("reserved", ctypes.c_ubyte * HANDLE_SIZE)]


_LOCK = threading.Lock()
_DRIVER: Any = None


def _driver() -> Any:
    global _DRIVER
    with _LOCK:
        if _DRIVER is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as e:
                raise DeviceShareError(f"no CUDA driver library: {e}") from e
            u64, size = ctypes.c_uint64, ctypes.c_size_t
            lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(u64), size]
            lib.cuMemFree_v2.argtypes = [u64]
            lib.cuMemGetAddressRange_v2.argtypes = [ctypes.POINTER(u64), ctypes.POINTER(size), u64]
            lib.cuIpcGetMemHandle.argtypes = [ctypes.POINTER(_Handle), u64]
            lib.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(u64), _Handle, ctypes.c_uint]
            lib.cuIpcCloseMemHandle.argtypes = [u64]
            _DRIVER = lib
        return _DRIVER


def _check(code: int, what: str) -> None:
    if code != 0:
        raise DeviceShareError(f"{what} failed with CUDA error {code}")


class _DeviceBytes:
    """A raw device allocation seen by torch as a uint8 tensor (through the CUDA array interface, no copy)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3,
                                         "strides": None}


def _as_tensor(ptr: int, nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(_DeviceBytes(ptr, nbytes), device=device)


class Exporter:
    """The child's side: device copies of outputs, exported by handle, freed at the parent's next command."""

    def __init__(self) -> None:
        self.live: list[int] = []

    def export(self, tensors: list[torch.Tensor]) -> list[dict[str, Any]]:
        for t in tensors:  # a host tensor's bytes would be copied to a temporary, never into the shared block
            if not t.is_cuda:
                raise DeviceShareError(f"only device tensors are shared, not one on {t.device}")
        lib, specs = _driver(), []
        try:
            for t in tensors:
                flat = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)
                nbytes = max(1, flat.numel())
                ptr = ctypes.c_uint64()
                _check(lib.cuMemAlloc_v2(ctypes.byref(ptr), nbytes), "cuMemAlloc")
                self.live.append(ptr.value)
                if flat.numel():
                    _as_tensor(ptr.value, flat.numel(), flat.device).copy_(flat)
                handle = _Handle()
                _check(lib.cuIpcGetMemHandle(ctypes.byref(handle), ptr.value), "cuIpcGetMemHandle")
                specs.append({"handle": ctypes.string_at(ctypes.addressof(handle), HANDLE_SIZE).hex(),
                              "bytes": int(flat.numel())})
            torch.cuda.synchronize()
        except DeviceShareError:
            self.release()
            raise
        return specs

    def release(self) -> None:
        if not self.live:
            return
        torch.cuda.synchronize()
        lib = _driver()
        for ptr in self.live:
            lib.cuMemFree_v2(ptr)
        self.live.clear()


def _room_for(nbytes: int, device: torch.device, reserve: int = 0) -> torch.Tensor:
    """Where the parent keeps a shared output: on ``device``, or in host memory when the device has no room left
    for it and ``reserve`` bytes more (what the parent's references still need there; the comparison then moves it
    to the reference a chunk at a time)."""
    if reserve and _free_bytes(device) < nbytes + reserve:
        return torch.empty(nbytes, dtype=torch.uint8)
    try:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
    try:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    except torch.OutOfMemoryError:
        return torch.empty(nbytes, dtype=torch.uint8)


def _free_bytes(device: torch.device) -> int:
    """Free on the device, and what this process's allocator holds unused there."""
    with torch.cuda.device(device):
        return int(torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved() - torch.cuda.memory_allocated())


def import_bytes(spec: dict[str, Any], device: torch.device, reserve: int = 0) -> torch.Tensor:
    """The parent's side: the shared bytes, cloned into a uint8 tensor of the parent's own on ``device`` (in host
    memory where that would leave less than ``reserve`` bytes free there). Raises DeviceShareError for a handle
    that does not open or an allocation smaller than the header says."""
    raw = bytes.fromhex(str(spec["handle"]))
    nbytes = int(spec["bytes"])
    if len(raw) != HANDLE_SIZE or nbytes < 0:
        raise DeviceShareError("malformed device handle")
    lib = _driver()
    with torch.cuda.device(device):
        torch.cuda.current_stream(device).synchronize()  # the device's primary context is current on this thread
        handle = _Handle()
        ctypes.memmove(ctypes.addressof(handle), raw, HANDLE_SIZE)
        ptr = ctypes.c_uint64()
        _check(lib.cuIpcOpenMemHandle_v2(ctypes.byref(ptr), handle, LAZY_ENABLE_PEER_ACCESS), "cuIpcOpenMemHandle")
        try:
            base, size = ctypes.c_uint64(), ctypes.c_size_t()
            _check(lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ptr.value),
                   "cuMemGetAddressRange")
            if ptr.value + nbytes > base.value + size.value:
                raise DeviceShareError(f"shared allocation of {size.value} bytes, but the header says {nbytes}")
            out = _room_for(nbytes, device, reserve)
            if nbytes:
                out.copy_(_as_tensor(ptr.value, nbytes, device))
            torch.cuda.synchronize(device)
        finally:
            lib.cuIpcCloseMemHandle(ptr.value)
    return out
