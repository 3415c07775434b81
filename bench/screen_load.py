"""What loading a candidate costs the screen, with and without the quick build, on a problem whose reference holds
large weights: one batch of torch candidates (checked, then timed, so each is loaded twice) screened in one process.

    PYTHONPATH=src python3 bench/screen_load.py --device cuda --candidates 8
    PYTHONPATH=src python3 bench/screen_load.py --device cpu --candidates 4   # the harness's own time, no kernels

The times are the screen's wall time for the batch (after a first batch has started the process): the harness's
load and timing work, not a kernel's speed.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

# torch's own embedding bag, in a file of its own per candidate (a comment tells them apart)
CANDIDATE = '''import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, num_embeddings, dim):
        super().__init__()
        self.bag = nn.EmbeddingBag(num_embeddings, dim, mode="sum")

    def forward(self, indices, offsets):
        return F.embedding_bag(indices, self.bag.weight, offsets, mode="sum")  # {i}
'''


def screen_once(problem: Path, device: str, n: int, quick: bool) -> dict:
    from kernelevolve.candidate import Candidate
    from kernelevolve.evaluate import EvalConfig, Evaluator
    from kernelevolve.evaluate.screen import ScreenConfig, Screener
    from kernelevolve.problem import load_problem

    ev = Evaluator(load_problem(problem), EvalConfig(device=device), Path(tempfile.mkdtemp(prefix="screen-load-")))
    with Screener(ev, ScreenConfig(timeout_s=300.0, parallel=1, quick_build=quick)) as screener:
        screener.screen([Candidate(CANDIDATE.format(i=-1))])  # the process started, the first load
        t = time.perf_counter()
        results = screener.screen([Candidate(CANDIDATE.format(i=i)) for i in range(n)])
        wall = time.perf_counter() - t
    return {"quick": quick, "candidates": n, "wall_s": round(wall, 3), "per_candidate_s": round(wall / n, 3),
            "statuses": [r.status.value for r in results], "builds": [r.details.get("build") for r in results],
            "stats": screener.stats[-1]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problem", type=Path, default=HERE / "problems" / "embedding_bag_sum.py")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cpu")
    ap.add_argument("--candidates", type=int, default=4)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    import torch

    rows = [screen_once(args.problem, args.device, args.candidates, quick) for quick in (True, False)]
    out = {"date": time.strftime("%Y-%m-%d"), "device": args.device, "torch": torch.__version__,
           "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
           "command": "python3 bench/screen_load.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "problem": args.problem.name, "rows": rows, "full_over_quick": round(rows[1]["wall_s"] / rows[0]["wall_s"], 2)}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    for r in rows:
        print(f"{'quick' if r['quick'] else 'full '}: {r['candidates']} candidates in {r['wall_s']:.2f} s "
              f"({r['per_candidate_s']:.2f} s each), {set(r['statuses'])}")
    print(f"full build / quick build: {out['full_over_quick']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
