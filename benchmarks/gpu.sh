#!/usr/bin/env bash
# Every GPU measurement #47 asks for, in one go, for a session that is lent a GPU (~3 minutes on an H100):
# - the CUDA tests: streams bit-identical to the CPU's, an eager step loop that never synchronises, CUDA-graph
#   replays = eager steps (tests/test_capture.py);
# - the equal-client workloads (W1, the CGAU setting, Fed-FSNet's MNIST protocol) with train.capture on and off,
#   and their stacked ideal eager and captured as a CUDA graph (engine.py);
# - the unequal workload's round with its stacked ideal and GEMM limit (unequal.py);
# - stacked sweeps of 1, 5 and 20 seeds (stacked_sweep.py);
# - with PFLLIB set, PFLlib's own loop on the same federation and device (peers.py).
# One JSON per step, steps.txt and errors.log go to $OUT (default ./gpu-results): at most 8 files, what the device
# tool brings back. Each step has a time limit; a failure is recorded and the next step still runs.
#
#     OUT=/path PFLLIB=/path/to/PFLlib/system bash benchmarks/gpu.sh
#
# The device machine has no hetfed install and no network: the source is read from src/ (PYTHONPATH). Its image
# lacks pydantic: carry pydantic, pydantic_core, annotated-types and typing-inspection as cp312 wheels and put
# them on PYTHONPATH first (results/gpu_h100_2026-11-26/README.md has the commands that ran).
set -u
cd "$(dirname "$0")/.."
out=${OUT:-gpu-results}
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/steps.txt" 2>&1
$py -c "import torch, sys; print(sys.version, torch.__version__, torch.version.cuda)" >> "$out/steps.txt" 2>&1
step() {  # name, seconds, command…
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    echo "== $name" >> "$out/errors.log"
    if timeout "$limit" "$@" > "$out/$name.json" 2>> "$out/errors.log"; then status=ok; else status="failed ($?)"; fi
    echo "$name: $status in $((SECONDS - t0)) s" | tee -a "$out/steps.txt"
}
step cuda_tests 120 $py -m pytest -q -n0 -p no:cacheprovider tests/test_capture.py tests/test_streams.py -k "cuda or bit_identical or synchronises"
step engine 120 bash -c "cd benchmarks && $py engine.py --device cuda --rounds 2 --threads 4 --json --cases compute_bound overhead_bound fsnet_protocol"
step unequal 120 bash -c "cd benchmarks && $py unequal.py --device cuda --rounds 2 --threads 4 --json"
step stacked_sweep 120 bash -c "cd benchmarks && $py stacked_sweep.py --device cuda --rounds 10 --seeds 1 5 20 --threads 4"
if [ -n "${PFLLIB:-}" ]; then
    step peers 100 bash -c "cd benchmarks && $py peers.py --pfllib '$PFLLIB' --device cuda --rounds 2 --threads 4"
fi
