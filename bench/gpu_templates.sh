#!/usr/bin/env bash
# On a GPU machine, from the repo root: the template library's GPU tests, then the benchmark suite over every GPU.
# Usage: OUT=dir BUDGET=60 PROBLEMS="softmax_bf16 ..." bash bench/gpu_templates.sh
# Writes logs and JSON under ${OUT:-bench/results/gpu} and prints the suite's table last.
set -uo pipefail
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-bench/results/gpu}"
GPUS="$(nvidia-smi --list-gpus | wc -l)"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
if [ "${SKIP_TESTS:-0}" != "1" ]; then
  TRITON_INTERPRET=0 python3 -m pytest -q -m gpu tests/gpu/test_templates_gpu.py tests/templates -p no:cacheprovider 2>&1 | tee "$OUT/template_gpu_tests.log" | tail -15
fi
# shellcheck disable=SC2086
python3 bench/suite.py --device cuda --gpus "$GPUS" --budget-s "${BUDGET:-60}" --max-evals "${MAX_EVALS:-40}" \
  --out-dir "$OUT/suite" --json "$OUT/suite.json" ${PROBLEMS:+--problems $PROBLEMS} 2>&1 | tee "$OUT/suite.log" | tail -40
