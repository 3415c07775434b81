#!/usr/bin/env bash
# On a GPU machine, from the repo root: the GPU tests (cheats on CUDA included), the CPU anti-cheat suite, and the
# harness-overhead
# benchmark. Writes logs and JSON under ${OUT:-bench/results/gpu} and prints a short table last.
set -uo pipefail
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-bench/results/gpu}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
python3 -m pytest -q -m gpu tests/gpu tests/evaluate -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
python3 -m pytest -q -m "not gpu" tests/evaluate -p no:cacheprovider 2>&1 | tee "$OUT/cheats.log" | tail -8
python3 bench/harness_overhead.py --device cuda --n "${N:-6}" --json "$OUT/overhead.json" 2>&1 | tee "$OUT/overhead.log" | tail -4
echo "== summary"; tail -1 "$OUT/gpu_tests.log"; tail -1 "$OUT/cheats.log"; tail -3 "$OUT/overhead.log"
