#!/usr/bin/env bash
# On a GPU machine, from the repo root: the GPU tests, then a judge-only KernelBench pass that resumes from KB_JSON.
# The KernelBench folder must be reachable there: KB_ROOT (default ../shared/kernelbench).
# Usage: OUT=dir STEPS="tests kernelbench" TESTS="tests" KB_ROOT=dir KB_JSON=file KB_PROBLEMS="..." \
#        KB_DEADLINE=400 KB_RETRY=1 bash bench/gpu_judge.sh     (KB_RETRY: run the failed rows again)
set -uo pipefail
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
OUT="${OUT:-out/gpu}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
df -h /dev/shm | tail -1 | tee -a "$OUT/gpu.txt"
for step in ${STEPS:-tests kernelbench}; do
  case "$step" in
    tests)
      # shellcheck disable=SC2086
      python3 -m pytest -v -m gpu ${TESTS:-tests} -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "PASS|FAIL|ERROR|passed|failed|Fatal" | tail -40 ;;
    kernelbench)
      [ -n "${KB_JSON:-}" ] && [ -f "$KB_JSON" ] && cp "$KB_JSON" "$OUT/kernelbench.json"
      # shellcheck disable=SC2086
      python3 bench/kernelbench.py --root "${KB_ROOT:-../shared/kernelbench}" --level 1 --judge-only \
        --json "$OUT/kernelbench.json" --out-dir /tmp/kernelbench ${KB_PROBLEMS:+--problems $KB_PROBLEMS} \
        ${KB_DEADLINE:+--deadline-s $KB_DEADLINE} ${KB_RETRY:+--retry-failed} 2>&1 | tee "$OUT/kernelbench.log" | tail -30 ;;
    *) echo "unknown step $step (tests, kernelbench)"; exit 2 ;;
  esac
done
echo "== summary"; tail -1 "$OUT/gpu_tests.log" 2>/dev/null; true
