#!/bin/bash
# What compiling a CNN's training step costs on this CPU (#74 §4): `hetfed run` of the default experiment with one
# method (FedAvg on the model named), ROUNDS rounds, once with train.capture compile on an empty inductor cache (the
# compiling included) and once eager; the wall seconds of each, one process a line, appended to compile_time.log.
# Run from the checkout with its venv active:  bash results/benchmarks_cpu_2026-12-01e/cnn_compile_time.sh [ROUNDS]
rounds=${1:-30}
here="$(dirname "$0")"
for kind in cnn cnn4; do
  for mode in off compile; do
    cache=$(mktemp -d)
    out=$(mktemp -d)/run
    start=$(date +%s.%N)
    TORCHINDUCTOR_CACHE_DIR=$cache OMP_NUM_THREADS=2 hetfed run --out "$out" --no-report --quiet \
      --set train.rounds=$rounds --set train.capture=$mode \
      --set "methods=[{name: $kind, algorithm: fedavg, model: {kind: $kind}}]" >/dev/null 2>&1 || echo "FAILED $kind $mode"
    end=$(date +%s.%N)
    echo "$kind $mode rounds=$rounds wall_s=$(echo "$end - $start" | bc)" | tee -a "$here/compile_time.log"
    rm -rf "$cache" "$(dirname "$out")"
  done
done
