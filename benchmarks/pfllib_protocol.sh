#!/usr/bin/env bash
# PFLlib's Fashion-MNIST protocol (#74 §5) on one lent GPU, in a fixed budget of wall time:
# configs/leaderboard_pfllib_fmnist.yaml (20 clients, Dirichlet 0.1, 75/25, cnn4, B = 10, E = 1, SGD lr 0.005, every
# client every round, evaluated every round), the methods of PFLlib's published Fashion-MNIST table that hetfed has
# (and Local), 3 seeds, PFLlib's 2 000 rounds configured.
#
# The methods are split into PROCS processes sharing the GPU (default: one a line below, at most one a core; with
# fewer, each takes every PROCS-th line) — a cnn4 round of 20 clients is launch-bound: one process leaves the GPU
# mostly idle; beyond ~6 processes none is gained, results/gpu_h200_2026-11-28 — each a
# `hetfed sweep --methods NAMES --each-method --stack` × 3 seeds (every method's runs one stack of clients, each run
# one method as its entry in the config has it). Each run's rounds stop
# once they have taken ROUNDS_S seconds (train.time_limit; default BUDGET − 60, the rest for starting, loading and
# the runs' ends): its last round is evaluated and the run ends as a run does — FedBABU's fine-tuning, summaries,
# the sweep's tables. At BUDGET seconds every sweep still going gets SIGTERM: its runs are marked stopped, each
# metrics.csv holding every evaluation up to then. `results/tables.py pfllib` reads each method at the rounds its
# runs reached (stated in the table: PFLlib's rule is a best over rounds, so fewer rounds than 2 000 can only lower
# it). No calibration sweep: the whole budget trains. No Γ either (heterogeneity.gamma=false: Γ and Γ(x|y) of 784
# pixels took 20–30 s a run on 2 cores; PFLlib's table has none).
#
#     OUT=/path BUDGET=300 bash benchmarks/pfllib_protocol.sh
#
# MEMORY_MB (default 2000) is each process's train.memory_budget_mb: left to itself, each takes a quarter of the GPU
# memory free when it starts, and six processes starting together ran out of it (2026-11-30). Each sweep's progress
# lines (a timestamp every 10 s with the round its stack reached) are in $OUT/gN.log. METHOD_GROUPS replaces the
# lines below: names of the config's methods, a space between them, ';' between lines (METHOD_GROUPS='fedavg;ditto').
#
# On the device machine: hetfed read from src/ (PYTHONPATH), pydantic carried as wheels (.whl), Fashion-MNIST's
# four IDX files carried in .data/fashion-mnist (HETFED_DATA). On a CPU, `DATASET=digits DEVICE=cpu BUDGET=60 THREADS=1
# PROCS=2` checks the script itself in a minute and a half.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-pfllib-results}
budget=${BUDGET:-300}
rounds_s=${ROUNDS_S:-$((budget > 120 ? budget - 60 : budget / 2))}
device=${DEVICE:-cuda}
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HETFED_DATA=${HETFED_DATA:-$PWD/.data}
py=${PYTHON:-python3}
config=configs/leaderboard_pfllib_fmnist.yaml
# PFLlib's Fashion-MNIST table's methods that hetfed has, by name, one line per process, the costliest rounds (pFedMe's
# K = 5 inner steps, the methods that train two models) spread over the lines; each runs as its entry in $config says
# (its parameters and train settings: Per-FedAvg's two epochs, pFedMe's λ 1 and η_p 0.01, FedRep's head epoch …)
groups=('pfedme fedavg' 'perfedavg fedper local' 'ditto apfl' 'fedgen fedrep fedbabu' 'fedcp gpfl fedrod'
        'fedala fedfomo feddbe fedproto fedprox')
if [ -n "${METHOD_GROUPS:-}" ]; then IFS=';' read -ra groups <<< "$METHOD_GROUPS"; fi  # other lines, ';' between
cores=$(nproc)
n=${PROCS:-$((cores < ${#groups[@]} ? cores : ${#groups[@]}))}  # no more processes than cores (the H200 lent on
# 2026-11-30 had 4: six processes there waited for the cores, not the GPU)
lines=()  # each process's methods, all read before any starts
for ((g = 0; g < n; g++)); do
    names=${groups[g]}
    for ((h = g + n; h < ${#groups[@]}; h += n)); do names+=" ${groups[h]}"; done  # fewer processes than lines
    names=${names// /,}
    # a name $config lacks stops the script here, before any sweep starts (hetfed config's one-line error)
    $py -m hetfed config "$config" --methods "$names" > /dev/null || exit 2
    lines+=("$names")
done
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $py -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda)"
  nproc; } > "$out/machine.txt" 2>&1
work=$(mktemp -d)
t0=$SECONDS
sweeps=()
for ((g = 0; g < n; g++)); do
    methods=${lines[g]}
    sweeps+=("$work/g$g")
    OMP_NUM_THREADS=${THREADS:-2} timeout -k 30 -s TERM "$budget" $py -c \
        "import sys; from hetfed.cli import entry; sys.argv[0] = 'hetfed'; entry()" \
        sweep "$config" --methods "$methods" --each-method --seeds 3 --stack \
        --set train.rounds=2000 --set train.device="$device" --set dataset.name="${DATASET:-fashion-mnist}" \
        --set heterogeneity.gamma=false --set train.checkpoint_every=null --out "$work/g$g" \
        --set train.memory_budget_mb="${MEMORY_MB:-2000}" --set train.time_limit="$rounds_s" \
        > "$out/g$g.log" 2>&1 &
done
wait
echo "$n stacked sweeps on one device, each run's rounds limited to ${rounds_s} s (train.time_limit), SIGTERM at" \
    "${budget} s; wall $((SECONDS - t0)) s" | tee "$out/log.txt"
$py results/tables.py pfllib "${sweeps[@]}" > "$out/against_pfllib.md" 2>> "$out/log.txt"
# each run's metrics.csv and config (the rounds it reached, every evaluation), compressed
tar cf - --exclude=checkpoints --exclude=figures --exclude=report.html --exclude=federation.npz -C "$work" . \
    | xz -6 > "$out/runs.tar.xz"
