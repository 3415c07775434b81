"""Compile (not run) every template kernel of the bench problems' first candidates for an sm_90 GPU, on a machine
without one: the interpreter accepts code the real compiler rejects (loop-carried type changes, bad layouts, shared
memory past the limit). A stand-in driver answers the device queries; each launch becomes a compile-only warmup.

Usage: python tests/templates/compile_sm90.py [--full] [--n N] [--ir DIR] [STEM ...]; prints one JSON line per
candidate."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "src"), str(ROOT / "bench")]
SMEM_LIMIT = 232448  # bytes of shared memory one H100/H200 block may opt into


def resource_usage(cubin: bytes) -> dict[str, int]:
    """Registers and local-memory bytes (spills) of a cubin, from the cuobjdump that ships with triton."""
    import re
    import subprocess

    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True).stdout
    found = dict(re.findall(r"\b(REG|LOCAL):(\d+)", out))
    return {"regs": int(found.get("REG", -1)), "spill_bytes": int(found.get("LOCAL", -1))}


class _Sm90:
    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


def main() -> int:
    from kernelevolve.problem import build_model, import_module_from_path, load_problem, make_inputs
    from kernelevolve.propose.base import ProposalContext
    from kernelevolve.propose.template import TemplateProposer
    from kernelevolve.templates.base import load_source
    from tests.benchsuite import load_suite
    from tile_probe import override  # bench/tile_probe.py

    ap = argparse.ArgumentParser()
    ap.add_argument("stems", nargs="*")
    ap.add_argument("--full", action="store_true", help="production sizes instead of SMALL")
    ap.add_argument("--n", type=int, default=2, help="candidates per problem")
    ap.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE",
                    help="render every region that has this knob with this value (e.g. SCHEDULE=tma)")
    ap.add_argument("--ir", type=Path, help="also write each kernel's TTGIR here (problem_candidate_kernel.ttgir)")
    args = ap.parse_args()
    overrides = dict(item.split("=", 1) for item in args.set)
    compiled: list[tuple[str, object]] = []
    original = JITFunction.run

    def compile_only(self, *a, grid, warmup, **kw):
        kernel = original(self, *a, grid=grid, warmup=True, **kw)
        compiled.append((self.fn.__name__, kernel))
        return kernel

    driver.set_active(_Sm90())
    JITFunction.run = compile_only
    suite = load_suite()
    for path in suite.problem_paths(args.stems or None):
        src = path if args.full else suite.write_small_copy(path, Path(tempfile.mkdtemp()))
        problem = load_problem(src, "cpu")
        module = import_module_from_path(src, f"_sm90_{path.stem}")
        proposer = TemplateProposer("cuda", seed=0)
        cands = proposer.propose(ProposalContext(problem, "cuda", None, []), args.n)
        if overrides:
            cands = [override(proposer, problem, c, overrides)[0] or c for c in cands]
        for i, cand in enumerate(cands):
            compiled.clear()
            row = {"problem": path.stem, "label": cand.meta["label"]}
            try:
                new = load_source(cand.source, f"_sm90_{path.stem}_{i}").ModelNew(*module.get_init_inputs())
                new.load_state_dict(build_model(module, "Model", 0).state_dict())
                with torch.no_grad():
                    new(*make_inputs(module, 1))
                # tensor-core instructions in the PTX: Hopper's wgmma, or the older mma.sync (no tensor cores: 0, 0)
                row["kernels"] = {name: {"shared": k.metadata.shared, "num_warps": k.metadata.num_warps,
                                         "wgmma": k.asm["ptx"].count("wgmma.mma_async"),
                                         "mma": k.asm["ptx"].count("mma.sync"),
                                         **resource_usage(k.asm["cubin"])} for name, k in compiled}
                for name, k in compiled if args.ir else []:
                    args.ir.mkdir(parents=True, exist_ok=True)
                    (args.ir / f"{path.stem}_{i}_{name}.ttgir").write_text(k.asm["ttgir"])
                row["ok"] = bool(compiled) and all(k.metadata.shared <= SMEM_LIMIT for _, k in compiled)
            except Exception as e:  # report every failure, keep going
                row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:500]}")
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
