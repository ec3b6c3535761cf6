#!/usr/bin/env bash
# Every GPU measurement #47 asks for, in one go, for a session that is lent a GPU (~10 minutes on an H100):
# the CUDA tests (streams bit-identical to the CPU's, a round's step loop that never synchronises), the unequal
# workload's round with its stacked ideal and GEMM limit, stacked sweeps of 1, 5 and 20 seeds, and the
# default / FedMoE / Fed-FSNet configs on CPU and GPU side by side. JSON and logs go to $OUT (default
# ./gpu-results); each step's failure is recorded and the next one still runs.
#
#     OUT=/path bash benchmarks/gpu.sh
set -u
cd "$(dirname "$0")/.."
out=${OUT:-gpu-results}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/device.csv" 2>&1
step() {  # name, command…
    local name=$1; shift
    local t0=$SECONDS
    if "$@" > "$out/$name.out" 2> "$out/$name.err"; then status=ok; else status="failed ($?)"; fi
    echo "$name: $status in $((SECONDS - t0)) s" | tee -a "$out/steps.txt"
}
step cuda_tests python -m pytest -q -n0 tests/test_streams.py -k "cuda or bit_identical or synchronises"
step unequal bash -c "cd benchmarks && python unequal.py --device cuda --rounds 3 --json"
step stacked_sweep bash -c "cd benchmarks && python stacked_sweep.py --device cuda --rounds 20 --seeds 1 5 20"
step devices bash -c "cd benchmarks && python devices.py --json"
