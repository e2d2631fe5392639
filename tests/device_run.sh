#!/usr/bin/env bash
# One call on the lent GPU machine: GPU tests, kernel benchmarks, engine benchmark.
# Usage (from the repo root, on the GPU machine): tests/device_run.sh [tests] [kernels] [profile] [engine] [engine-int4]
#   [sim24] [engine-quick] [spec-tests] [spec-default] [spec-oracle] [spec-slow] [spec-32k] [spec-long] [spec-bf16]
# Logs and JSON go to $OUT (or ./device-out). Wheels in .whl/ (fla-core) are installed first.
set -uo pipefail
OUT=${OUT:-device-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
what=${*:-tests kernels engine}
for step in $what; do
  echo "=== $step ==="
  case $step in
    tests)   python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_*.py tests/test_pdl.py tests/test_gpu_capture.py tests/test_gpu_parity.py tests/test_moe.py \
               2>&1 | tee "$OUT/gpu_tests.log" | tail -40 ;;
    kernels) python3 -m qwendesk_kernels.bench --json "$OUT/kernels.json" 2>&1 | tee "$OUT/kernels.log" | tail -60 ;;
    engine)  python3 -m engine.bench --json "$OUT/engine.json" 2>&1 | tee "$OUT/engine.log" | tail -40 ;;
    profile) python3 -m engine.bench --profile "$OUT/prof" 2>&1 | tee "$OUT/profile.log" | tail -60 ;;
    engine-int4) python3 -m engine.bench --weights int4 --json "$OUT/engine_int4.json" 2>&1 | tee "$OUT/engine_int4.log" | tail -40 ;;
    sim24)   python3 -m engine.bench --weights int4 --simulate-gb 24 --json "$OUT/sim24.json" 2>&1 | tee "$OUT/sim24.log" | tail -40 ;;
    spec-tests) python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_speculation.py tests/test_gpu_capture.py \
               tests/test_draft_policy.py tests/test_host_cache.py 2>&1 | tee "$OUT/spec_tests.log" | tail -30 ;;
    spec-slow) python3 -m engine.bench --weights int4 --draft-oracle 0.82,0 --drafts 3 --profiles C8,C4 \
               --decode-tokens 128 --slow-stacks --json "$OUT/spec_slow.json" 2>&1 | tee "$OUT/spec_slow.log" \
               | grep -v "^{" | tail -40 ;;
    spec-default) python3 -m engine.bench --weights int4 --no-hf --contexts 8192,32768,131072 --profiles C1,C8 \
               --decode-tokens 64 --json "$OUT/spec_default.json" 2>&1 | tee "$OUT/spec_default.log" | tail -40 ;;
    spec-oracle) python3 -m engine.bench --weights int4 --draft-oracle 0.82,0.93/0.81/0.64,0 --drafts 3 \
               --profiles C1,C2,C4,C8 --json "$OUT/spec_oracle.json" 2>&1 | tee "$OUT/spec_oracle.log" | tail -40 ;;
    spec-32k) python3 -m engine.bench --weights int4 --draft-oracle 0 --drafts 3 --profiles C1,C8 --spec-context 32768 \
               --decode-tokens 64 --json "$OUT/spec_32k.json" 2>&1 | tee "$OUT/spec_32k.log" | tail -20 ;;
    spec-long) python3 -m engine.bench --weights int4 --kv-dtype int8 --draft-oracle 0.82 --drafts 3 --profiles C1 \
               --spec-context 131072 --decode-tokens 64 --json "$OUT/spec_long.json" 2>&1 | tee "$OUT/spec_long.log" \
               | tail -20 ;;
    spec-bf16) python3 -m engine.bench --draft-oracle 1,0.82,0 --drafts 3 --profiles C1,C8 --decode-tokens 64 \
               --json "$OUT/spec_bf16.json" 2>&1 | tee "$OUT/spec_bf16.log" | tail -20 ;;
    engine-quick) python3 -m engine.bench --no-hf --contexts 512,8192 --profiles C1,C8 --decode-tokens 64 \
               --json "$OUT/engine.json" 2>&1 | tee "$OUT/engine.log" | tail -40 ;;
  esac
done
