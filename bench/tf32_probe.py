"""The independent clock's precision: eager and torch.compile's kernel of each problem timed by bench/dobench.py with
TF32 as the problem declares it (the judge's setting) and with TF32 on (PyTorch's default for cuDNN convolutions).

    PYTHONPATH=src python3 bench/tf32_probe.py PROBLEM.py ... [--json out.json]

Prints one row per problem and setting: the two times and their ratio.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    from kernelevolve.propose.inductor import SEEDS, render

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", type=Path, nargs="+")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in args.problems:
            kernel = Path(tmp) / f"{path.stem}_compile.py"
            kernel.write_text(render(path.read_text(), dict(SEEDS)["default"], "default"))
            for tf32 in ("problem", "on"):
                # a fresh process for each setting, as the benchmarks run dobench.py
                argv = [sys.executable, str(HERE / "dobench.py"), str(path), str(kernel), "--tf32", tf32]
                proc = subprocess.run(argv, capture_output=True, text=True, check=True)
                out = json.loads(proc.stdout.strip().splitlines()[-1])
                rows.append({"problem": path.stem, "tf32": tf32, "eager_ms": out["eager_ms"],
                             "compile_ms": out["kernel_ms"], "speedup_eager": out["speedup_eager"]})
                print(f"{path.stem[:48]:48s} tf32={tf32:7s} eager {out['eager_ms']:8.3f} ms  compile "
                      f"{out['kernel_ms']:8.3f} ms  {out['speedup_eager']:.2f}x", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
