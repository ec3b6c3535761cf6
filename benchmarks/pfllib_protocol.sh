#!/usr/bin/env bash
# PFLlib's Fashion-MNIST protocol (#74 §5) on one lent GPU, in a fixed budget of wall time:
# configs/leaderboard_pfllib_fmnist.yaml (20 clients, Dirichlet 0.1, 75/25, cnn4, B = 10, E = 1, SGD lr 0.005, every
# client every round, evaluated every round), the methods of PFLlib's published Fashion-MNIST table that hetfed has
# (and Local), 3 seeds — each method a grid point, the runs spread over JOBS processes sharing the GPU (a cnn4 round
# of 20 clients is launch-bound: one process leaves the GPU mostly idle).
#
# How many rounds: 2 000 is PFLlib's budget; what fits is measured, not guessed. A first sweep of R0 rounds (every
# method, every seed) is timed; the second runs R = R0 · (BUDGET − elapsed) / its time · 0.8 rounds (at most 2 000),
# its preparation counted as if it were rounds, so R is an underestimate of what fits. Both sweeps' tables come back.
#
#     OUT=/path BUDGET=480 JOBS=6 bash benchmarks/pfllib_protocol.sh
#
# On the device machine: hetfed read from src/ (PYTHONPATH), pydantic carried as wheels (.whl), Fashion-MNIST's
# four IDX files carried in .data/fashion-mnist (HETFED_DATA). On a CPU, `DATASET=digits DEVICE=cpu R0=1 BUDGET=60
# JOBS=2` checks the script itself in a minute.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-pfllib-results}
budget=${BUDGET:-480}
jobs=${JOBS:-6}  # processes share one GPU by time-slicing: beyond ~6 none is gained (results/gpu_h200_2026-11-28)
r0=${R0:-3}
device=${DEVICE:-cuda}
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HETFED_DATA=${HETFED_DATA:-$PWD/.data}
py=${PYTHON:-python3}
hetfed() { $py -c "import sys; from hetfed.cli import entry; sys.argv[0] = 'hetfed'; entry()" "$@"; }
# PFLlib's Fashion-MNIST table's methods that hetfed has, with the parameters of configs/leaderboard_pfllib_fmnist.yaml
# (pFedMe: PFLlib's λ 1, η_p 0.01; the pFedMe paper's λ 15, η_p 0.09 diverge on this CNN)
methods='[{name: fedavg, algorithm: fedavg}],[{name: fedprox, algorithm: fedprox, params: {mu: 0.01}}],'\
'[{name: fedgen, algorithm: fedgen}],[{name: perfedavg, algorithm: perfedavg}],[{name: pfedme, algorithm: pfedme, params: {lam: 1.0, personal_lr: 0.01}}],'\
'[{name: ditto, algorithm: ditto, params: {lam: 0.1}}],[{name: apfl, algorithm: apfl}],'\
'[{name: fedfomo, algorithm: fedfomo}],[{name: fedala, algorithm: fedala}],[{name: fedper, algorithm: fedper}],'\
'[{name: fedrep, algorithm: fedrep}],[{name: fedrod, algorithm: fedrod}],[{name: fedbabu, algorithm: fedbabu}],'\
'[{name: fedcp, algorithm: fedcp}],[{name: gpfl, algorithm: gpfl}],[{name: feddbe, algorithm: feddbe}],'\
'[{name: fedproto, algorithm: fedproto}],[{name: local, algorithm: local}]'
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $py -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda)"
  nproc; } > "$out/machine.txt" 2>&1
sweep() {  # rounds, folder
    hetfed sweep configs/leaderboard_pfllib_fmnist.yaml --grid "methods=$methods" --seeds 3 --jobs "$jobs" \
        --set train.rounds="$1" --set train.device="$device" --set dataset.name="${DATASET:-fashion-mnist}" \
        --set heterogeneity.iid_draws=0 --set train.memory_budget_mb=2000 --set train.checkpoint_every=null \
        --out "$2" --quiet
}
report() {  # folder, name: the tables and the runs' own values, without checkpoints
    $py results/tables.py leaderboard "$1" > "$out/$2_table.md" 2>> "$out/log.txt"
    $py results/tables.py pfllib "$1" > "$out/$2_against_pfllib.md" 2>> "$out/log.txt"  # each published number
    tar cf - --exclude=checkpoints --exclude=figures --exclude=report.html -C "$(dirname "$1")" "$(basename "$1")" \
        | xz -6 > "$out/$2.tar.xz"
}
work=$(mktemp -d)
t0=$SECONDS
sweep "$r0" "$work/calibration" >> "$out/log.txt" 2>&1
t1=$((SECONDS - t0))
report "$work/calibration" calibration
rounds=$($py - "$work/calibration" "$r0" "$((budget - SECONDS + t0))" "$t1" "$jobs" <<'PY'
import json, sys
from pathlib import Path
sweep, r0, left, t0, jobs = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
costs = [m["wall_seconds"] / r0 for run in json.loads((sweep / "sweep.json").read_text())["runs"]
         for m in json.loads((Path(run["run_dir"]) / "summary.json").read_text())["methods"].values()]
room = 0.85 * left  # what is left of the budget, 15 % kept for the tables and the stragglers
per_round = sum(costs) / jobs  # wall seconds a round of every run adds, spread over the processes
fixed = max(0.0, t0 - r0 * per_round)  # spawning, imports, data, Γ: paid again by the second sweep
by_total = (room - fixed) / max(per_round, 1e-9)
by_longest = room / max(max(costs), 1e-9)
print(max(r0, min(2000, int(min(by_total, by_longest)))))
PY
)
echo "calibration: $r0 rounds, every method and seed, in $t1 s; the full sweep: $rounds rounds" | tee -a "$out/log.txt"
t2=$SECONDS
sweep "$rounds" "$work/full" >> "$out/log.txt" 2>&1
echo "full: $rounds rounds in $((SECONDS - t2)) s (wall, $jobs processes on one GPU)" | tee -a "$out/log.txt"
report "$work/full" full
