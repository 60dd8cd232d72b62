#!/usr/bin/env bash
# The GPU tests and benchmarks in one go, on a CUDA machine whose Python already has torch, Triton
# and transformers (e.g. the lent H200). Wheels of what it lacks (hivemind and friends: see
# ../shared/gpu/fetch-wheels.sh) may sit in .whl/; they are installed into /tmp/site first.
#
#   bash benchmarks/run_gpu.sh [tests] [bench-kernels] [bench-swarm SETUPS] [breakdown] [bench-quant] [bench-growing]
#                              [bench-standby QUANT]
#
# bench-swarm and breakdown share one random Llama-2-7B-shaped checkpoint ($CKPT, written once).
# Everything is written under $OUT (default benchmarks/results/gpu): test log, benchmark logs, JSON.
# Each step has a time limit in seconds (T_TESTS, T_KERNELS, T_SWARM, T_BREAKDOWN, T_QUANT, T_GROWING, T_STANDBY)
# so one call fits a lease;
# TEST_FILES picks the test files of the `tests` step (default: every GPU test file).
# MPS=1 runs every step under a private CUDA MPS daemon (stopped on exit; $OUT/mps.log shows its clients).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
CKPT=${CKPT:-/tmp/llama2-7b-shaped}
export OUT PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >"$OUT/pip.log" 2>&1 || { tail -5 "$OUT/pip.log"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
else
  export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode --format=csv,noheader
if [ "${MPS:-0}" = 1 ]; then
  # A private CUDA MPS control daemon for this run's processes (their kernels then share one GPU
  # context instead of taking time-sliced turns), stopped on exit; `mps.log` says whether each
  # process really ran as an MPS client (its server list, and nvidia-smi's "M+C" process type).
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || { echo "MPS daemon did not start" >&2; exit 1; }
  ( for _ in $(seq 60); do
      { date +%T; echo get_server_list | nvidia-cuda-mps-control; nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader; nvidia-smi | grep -E "M\+C|  C  " ; } >>"$OUT/mps.log" 2>&1
      sleep 10
    done ) >/dev/null 2>&1 &
  MPS_POLL=$!
  trap 'kill $MPS_POLL 2>/dev/null; echo quit | nvidia-cuda-mps-control; sleep 2; cp -r "$CUDA_MPS_LOG_DIRECTORY" "$OUT/mps-daemon-log" 2>/dev/null' EXIT
fi
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'

while [ $# -gt 0 ]; do
  case "$1" in
    tests)
      # -v: a step cut by its time limit still shows which tests passed.
      timeout "${T_TESTS:-420}" python3 -m pytest -v -rs -m gpu -p no:cacheprovider -o addopts="" --durations=15 \
        ${TEST_FILES:-tests/test_gpu_serving.py tests/test_gpu_streaming.py tests/test_kernels_attention.py tests/test_kernels_fused.py tests/test_kernels_quant.py} \
        2>&1 | tee "$OUT/tests.log" | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|s (call|setup)" | tail -80 ;;
    bench-kernels)
      timeout "${T_KERNELS:-300}" python3 benchmarks/bench_gpu.py --steps 30 --no-hf 2>&1 | tee "$OUT/bench_gpu.log" | tail -20 ;;
    bench-swarm)
      shift
      timeout "${T_SWARM:-540}" python3 benchmarks/bench_gpu_swarm.py --setups "$1" --checkpoint "$CKPT" ${SWARM_ARGS:-} \
        2>&1 | tee "$OUT/bench_gpu_swarm.log" | tail -25 ;;
    breakdown)
      timeout "${T_BREAKDOWN:-240}" python3 benchmarks/bench_step_breakdown.py --checkpoint "$CKPT" 2>&1 \
        | tee "$OUT/bench_step_breakdown.log" | tail -14 ;;
    bench-quant)
      timeout "${T_QUANT:-300}" python3 benchmarks/bench_quant_kernels.py ${QUANT_ARGS:-} 2>&1 | tee "$OUT/bench_quant.log" | tail -40 ;;
    bench-growing)
      timeout "${T_GROWING:-240}" python3 benchmarks/bench_growing.py 2>&1 | tee "$OUT/bench_growing.log" | tail -12 ;;
    bench-standby)
      shift
      timeout "${T_STANDBY:-300}" python3 benchmarks/bench_streamed_standby.py --stream-quant "$1" ${STANDBY_ARGS:-} 2>&1 \
        | tee "$OUT/bench_streamed_standby_$1.log" | tail -10 ;;
    *) echo "unknown step $1" >&2; exit 2 ;;
  esac
  shift
done
