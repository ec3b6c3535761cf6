#!/bin/bash
# train.capture compile against eager for the CNNs (#74 §4), one process a line, run from the checkout with its venv
# active; appends to cnn_gain.log. Inductor's disk cache is warm after the first compile line: the figures are ms a
# training round, compile time not in them (benchmarks/stacked_sweep.py --per-round).
for rep in 3 4 5; do
for kind in cnn cnn4; do for mode in off compile; do
  line=$(OMP_NUM_THREADS=2 python benchmarks/stacked_sweep.py --per-round --rounds 60 --seeds 1 --set train.capture=$mode \
    --set "methods=[{name: $kind, algorithm: fedavg, model: {kind: $kind}}]" --repeats 2 2>/dev/null | tr -d '\n ' | grep -o '"1":{"ms_per_round":[0-9.]*')
  echo "$rep $kind $mode: $line" >> "$(dirname "$0")/cnn_gain.log"
done; done; done
