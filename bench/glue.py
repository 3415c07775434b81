"""What a composition costs before any kernel goes in: each model of bench/models against its own generated forward
(the captured graph op by op, as best_model.py runs the ops no kernel replaced), in eager and under torch.compile.

    PYTHONPATH=src python3 bench/glue.py --device cuda --json out/glue.json

The graph is captured in its normal form: LayerNorm, softmax and the like come out as their primitive ops, which the
template families claim. Where no kernel replaces them, the eager host runs those primitives one by one, so a
composition starts this far behind the model (``eager x``: the generated forward's time over the model's); the
compile host lets Inductor fuse them again (``compile x``: the generated forward under torch.compile over the model
under torch.compile). A call's time: the median by ``triton.testing.do_bench`` on a GPU, of 50 timed calls on the
CPU. ``--small`` uses the models' SMALL sizes (a CPU smoke run).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.record import record, write  # noqa: E402

MODELS = ROOT / "bench" / "models"


def call_ms(fn: Callable[[], Any], device: str) -> float:
    """The median time of one call of ``fn`` (ms): ``triton.testing.do_bench`` on a GPU, its CPU stand-in
    (bench/dobench.py) on the CPU."""
    if device == "cuda":
        from triton.testing import do_bench

        return do_bench(fn, return_mode="median")
    from bench.dobench import cpu_bench

    return cpu_bench(fn)


def measure(path: Path, device: str, work: Path, compiled: bool = True) -> dict[str, Any]:
    """One model file: its generated forward with no kernel in it, timed beside the model."""
    import torch

    from kernelevolve.model.compose import compose
    from kernelevolve.model.plan import plan_model
    from kernelevolve.problem import build_model, import_module_from_path, make_inputs

    plan = plan_model(path, device, work / "plan")
    text, _ = compose(plan.problem.source, plan.graph, [], "the model's graph op by op, no kernel in it")
    generated = work / "generated.py"
    generated.write_text(text)
    module = import_module_from_path(generated, f"_kernelevolve_glue_{path.stem}")
    inputs = make_inputs(module, 0, device=device)
    model = build_model(module, "Model", 0).to(device)
    new = build_model(module, "ModelNew", 0).to(device)
    new.load_state_dict(model.state_dict())
    row: dict[str, Any] = {"model": path.stem, "ops": len(plan.graph.calls())}
    with torch.no_grad():
        want, got = model(*inputs), new(*inputs)
        half = any(t.dtype in (torch.bfloat16, torch.float16) for t in torch.utils._pytree.tree_leaves(want)
                   if isinstance(t, torch.Tensor))
        tol = 3e-2 if half else 1e-3  # the primitives round a half-precision chain at other steps
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        row["model_ms"] = call_ms(lambda: model(*inputs), device)
        row["generated_ms"] = call_ms(lambda: new(*inputs), device)
        row["eager_x"] = row["generated_ms"] / row["model_ms"]
        if compiled:
            fast, fast_new = torch.compile(model), torch.compile(new.forward)
            row["model_compiled_ms"] = call_ms(lambda: fast(*inputs), device)
            row["generated_compiled_ms"] = call_ms(lambda: fast_new(*inputs), device)
            row["compile_x"] = row["generated_compiled_ms"] / row["model_compiled_ms"]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None)
    ap.add_argument("--models", nargs="+", help="stems of bench/models (default: all)")
    ap.add_argument("--small", action="store_true", help="the models' SMALL sizes")
    ap.add_argument("--no-compile", action="store_true", help="eager only")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--out-dir", type=Path, default=Path("out/glue"))
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    paths = sorted(MODELS.glob("*.py"))
    if args.models:
        paths = [p for p in paths if p.stem in args.models]
        if not paths:
            print(f"error: no model of bench/models named {' '.join(args.models)}", file=sys.stderr)
            return 2
    rows = []
    print(f"{'model':<26} {'ops':>4} {'model ms':>9} {'generated':>10} {'eager x':>8} {'compile x':>10}")
    for path in paths:
        work = args.out_dir / path.stem
        if args.small:
            from bench.models import small_copy

            path = small_copy(path, work / "small")
        try:
            row = measure(path, device, work, compiled=not args.no_compile)
        except Exception as e:  # a row that says why, and the next model
            row = {"model": path.stem, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        rows.append(row)
        if "error" in row:
            print(f"{row['model']:<26} error: {row['error'][:80]}")
            continue
        cx = f"{row['compile_x']:.2f}" if "compile_x" in row else "—"
        print(f"{row['model']:<26} {row['ops']:>4} {row['model_ms']:>9.4f} {row['generated_ms']:>10.4f} "
              f"{row['eager_x']:>8.2f} {cx:>10}", flush=True)
    write(args.json, record("glue.py", rows, device=device,
                            device_name=torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
                            small=args.small))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
