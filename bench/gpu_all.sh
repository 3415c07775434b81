#!/usr/bin/env bash
# On a GPU machine, from the repo root: any of the GPU test suite, the experience benchmark and the benchmark suite,
# each writing its logs and JSON under $OUT and printing a short summary last.
# Usage: OUT=dir STEPS="tests screen experience suite wide load throughput kernelbench models clock glue report" TOP=1 BUDGET=40 AGAIN=120 \
#        PAIRS="softmax_bf16 ..." PROBLEMS="..." EVALS=16 TESTS="tests/gpu" CONFIGS=240 \
#        LEVELS="1 2" SAMPLE=16 SEED=35 KB_PROBLEMS="level1/20_LeakyReLU" COVERAGE=table.json FAMILIES=matmul MIN_CLAIMED=0.8 LIMIT=36 DEADLINE=480 KB_JSON=earlier.json KB_ROOT=.kb \
#        MODELS="dlrm mmoe" L3_SEED=36 MODELS_JSON=earlier-models.json MODEL_TIMEOUT=540 TIMING=graph \
#        NO_MAX_AUTOTUNE=1 JUDGE=3 BASELINE=1 TESTS_TIMEOUT=120 SUITE_JSON=earlier-suite.json EXP_JSON=earlier-experience.json \
#        COMMIT=abc1234 PROBLEM=bench/problems/layernorm_bf16.py bash bench/gpu_all.sh
set -uo pipefail
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
# Wheels carried in .whl/ (a model's own imports the GPU image lacks, such as einops for KernelBench's Mamba2),
# installed without an index into a folder of their own
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
# the commit each row is written by: COMMIT where the copy has no git history
BENCH_COMMIT="${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
export BENCH_COMMIT
OUT="${OUT:-bench/results/gpu}"
GPUS="$(nvidia-smi --list-gpus | wc -l)"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
# A trace of the whole call, to set each timing beside (bench/trace.py): clocks, power and throttle reasons every
# 250 ms, and every process's share of the SMs each second.
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active \
  --format=csv,nounits -lms 250 > "$OUT/gpu_trace.csv" 2>&1 &
TRACE=$!
nvidia-smi pmon -s u -o DT -d 1 > "$OUT/pmon.txt" 2>&1 &
PMON=$!
trap 'kill $TRACE $PMON 2>/dev/null' EXIT
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
for step in ${STEPS:-tests experience}; do
  case "$step" in
    tests)
      # shellcheck disable=SC2086
      # TESTS_TIMEOUT: stop the tests after that many seconds and go on with the next step (0: no limit)
      timeout "${TESTS_TIMEOUT:-0}" python3 -m pytest -v -m gpu ${TESTS:-tests} -p no:cacheprovider --durations 15 2>&1 \
        | tee "$OUT/gpu_tests.log" | tail -30 ;;
    experience)
      # EXP_JSON names the rows of an earlier call to go on from (on one GPU); DEADLINE as for the suite
      EXP_GPUS="$GPUS"
      if [ -n "${EXP_JSON:-}" ]; then
        cp "$EXP_JSON" "$OUT/experience.json"
        EXP_GPUS=1
      fi
      # shellcheck disable=SC2086
      python3 bench/experience.py --device cuda --gpus "$EXP_GPUS" --budget-s "${BUDGET:-40}" \
        --out-dir "$OUT/experience" --json "$OUT/experience.json" ${PAIRS:+--pairs $PAIRS} ${EXP_JSON:+--resume} \
        ${DEADLINE:+--deadline-s $DEADLINE} 2>&1 | tee "$OUT/experience.log" | tail -15 ;;
    suite)
      # SUITE_JSON names the rows of an earlier call to go on from (its file at the AGAIN budget beside it), on one
      # GPU; DEADLINE stops starting problems after that many seconds
      SUITE_GPUS="$GPUS"
      if [ -n "${SUITE_JSON:-}" ]; then
        cp "$SUITE_JSON" "$OUT/suite.json"
        [ -n "${AGAIN:-}" ] && cp "${SUITE_JSON%.json}-${AGAIN}s.json" "$OUT/suite-${AGAIN}s.json"
        SUITE_GPUS=1
      fi
      # shellcheck disable=SC2086
      python3 bench/suite.py --device cuda --gpus "$SUITE_GPUS" --budget-s "${BUDGET:-40}" --out-dir "$OUT/suite" \
        --json "$OUT/suite.json" ${AGAIN:+--again-s $AGAIN} ${PROBLEMS:+--problems $PROBLEMS} \
        ${SUITE_JSON:+--resume} ${DEADLINE:+--deadline-s $DEADLINE} 2>&1 | tee "$OUT/suite.log" | tail -40 ;;
    load)
      # what loading a candidate costs the screen, with and without the quick build (a 512 MB embedding table)
      python3 bench/screen_load.py --device cuda --candidates "${EVALS:-8}" --json "$OUT/screen_load.json" 2>&1 \
        | tee "$OUT/screen_load.log" | tail -4 ;;
    screen)
      # shellcheck disable=SC2086
      # BASELINE=1 judges eager and torch.compile too; JUDGE: how many of the fastest to judge (default 5)
      python3 bench/screen.py --device cuda --problems ${PROBLEMS:-layernorm_fp32 rmsnorm_residual_bf16 softmax_bf16} \
        --configs "${CONFIGS:-240}" ${JUDGE:+--judge $JUDGE} ${BASELINE:+--baseline} --json "$OUT/screen.json" 2>&1 \
        | tee "$OUT/screen.log" | tail -30 ;;
    throughput)
      # shellcheck disable=SC2086
      python3 bench/throughput.py --device cuda --workers 1 "$GPUS" --problems ${PROBLEMS:-softmax_bf16} \
        --proposer "${PROPOSER:-template}" --evals "${EVALS:-16}" --out-dir "$OUT/throughput" \
        --json "$OUT/throughput.json" 2>&1 | tee "$OUT/throughput.log" | tail -12 ;;
    wide)
      # rows too wide for one program (bench/wide/): the row-reduction family's PARTS against the baselines
      python3 bench/suite.py --device cuda --gpus 1 --budget-s "${BUDGET:-20}" --out-dir "$OUT/wide" \
        --json "$OUT/wide.json" --problems bench/wide/*.py 2>&1 | tee "$OUT/wide.log" | tail -12 ;;
    kernelbench)
      # KernelBench problems a template family matches (bench/coverage.py's table), resumable: KB_JSON names a file
      # from an earlier call to go on from, DEADLINE stops starting problems after that many seconds, KB_ROOT names the
      # KernelBench folder where ../shared/kernelbench is not beside the checkout, FAMILIES keeps the problems with a
      # region of those template families (matmul: the GEMM problems)
      [ -n "${KB_JSON:-}" ] && cp "$KB_JSON" "$OUT/kernelbench.json"
      # shellcheck disable=SC2086
      # SAMPLE=N SEED=S: N problems drawn at random from the levels instead of the matched ones
      # KB_PROBLEMS="level1/20_LeakyReLU ...": those problems alone (rows of a draw run again, into a fresh KB_JSON)
      if [ -n "${KB_PROBLEMS:-}" ]; then PICK="--problems $KB_PROBLEMS"
      elif [ -n "${SAMPLE:-}" ]; then PICK="--sample $SAMPLE --seed ${SEED:-0}"
      else PICK="--matched ${COVERAGE:-bench/results/2026-12-02-kernelbench-coverage.json}"; fi
      python3 bench/kernelbench.py --root "${KB_ROOT:-../shared/kernelbench}" --device cuda --level ${LEVELS:-1 2} \
        $PICK ${LIMIT:+--limit $LIMIT} \
        ${MIN_CLAIMED:+--min-claimed $MIN_CLAIMED} ${FAMILIES:+--families $FAMILIES} ${NO_MAX_AUTOTUNE:+--no-max-autotune} \
        --budget-s "${BUDGET:-20}" ${DEADLINE:+--deadline-s $DEADLINE} --out-dir "$OUT/kernelbench" \
        --json "$OUT/kernelbench.json" 2>&1 | tee "$OUT/kernelbench.log" | tail -8
      python3 bench/kernelbench.py --markdown --json "$OUT/kernelbench.json" | tail -12 ;;
    models)
      # whole models (bench/models.py): the six of bench/models and the level-3 draw of L3_SEED, resumable:
      # MODELS_JSON names an earlier call's rows to go on from; DEADLINE stops starting models; MODEL_TIMEOUT ends one
      # model's run after that many seconds (its row says so), so that one model cannot take the whole call; each model's run folder
      # keeps its reports and best_model.py, its work folders and store dropped so that they come back
      [ -n "${MODELS_JSON:-}" ] && cp "$MODELS_JSON" "$OUT/models.json"
      # shellcheck disable=SC2086
      python3 bench/models.py --device cuda --budget-s "${BUDGET:-240}" --level3-seed "${L3_SEED:-36}" \
        ${MODELS:+--models $MODELS} ${KB_ROOT:+--level3-root $KB_ROOT/level3} ${DEADLINE:+--deadline-s $DEADLINE} \
        ${MODEL_TIMEOUT:+--timeout $MODEL_TIMEOUT} ${TIMING:+--timing $TIMING} \
        --json "$OUT/models.json" --out-dir "$OUT/models" 2>&1 | tee "$OUT/models.log" | tail -30
      find "$OUT/models" -name .work -type d -prune -exec rm -rf {} + ; rm -f "$OUT"/models/models.db* ;;
    clock)
      # where a composition's call goes, for each model of MODELS (bench/compose_clock.py): do_bench rounds, host
      # and device time a call, graphs built, cProfile; TOP problems get their default template kernel
      for m in ${MODELS:-dlrm}; do
        python3 bench/compose_clock.py --model "$m" --top "${TOP:-1}" --json "$OUT/clock-$m.json" 2>&1 \
          | tee "$OUT/clock-$m.log" | grep -E "^$m " ; done ;;
    glue)
      # each bench model against its generated forward with no kernel in it, eager and compiled (bench/glue.py)
      # shellcheck disable=SC2086
      python3 bench/glue.py --device cuda ${MODELS:+--models $MODELS} --json "$OUT/glue.json" \
        --out-dir /tmp/glue 2>&1 | tee "$OUT/glue.log" | tail -10 ;;
    report)
      # hardware counters of a problem's reference, a run of it (its report.html carries the counter table), and
      # the counters of that run's best kernel; the run's work folder is dropped so that the report comes back
      P="${PROBLEM:-bench/problems/layernorm_bf16.py}"
      python3 -m kernelevolve.cli inspect "$P" --device cuda --ncu > "$OUT/inspect_ref.txt" 2>&1
      python3 -m kernelevolve.cli optimize "$P" --device cuda --time-budget "${BUDGET:-45}" --out "$OUT/run" \
        --db "$OUT/run.sqlite" > "$OUT/run.log" 2>&1
      python3 -m kernelevolve.cli inspect "$P" --device cuda --ncu --candidate "$OUT/run/best.py" \
        > "$OUT/inspect_best.txt" 2>&1
      rm -rf "$OUT/run/.work" "$OUT"/run.sqlite*
      tail -4 "$OUT/run.log"; tail -3 "$OUT/inspect_best.txt" ;;
    *) echo "unknown step $step (tests, screen, experience, suite, load, throughput, kernelbench, report)"; exit 2 ;;
  esac
done
rm -rf "$OUT/experience"/*/ "$OUT/suite"/*/ "$OUT/kernelbench"/*/ "$OUT/throughput" "$OUT"/*/*.db* 2>/dev/null  # keep what comes back small: JSON and logs
echo "== summary"; tail -1 "$OUT/gpu_tests.log" 2>/dev/null; tail -2 "$OUT/experience.log" 2>/dev/null; true
