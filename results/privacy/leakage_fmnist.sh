#!/usr/bin/env bash
# Leakage against accuracy on Fashion-MNIST (#76), 3 seeds per cell: configs/privacy_digits.yaml on Fashion-MNIST at
# the leaderboard's budget (30 rounds). Membership (loss_threshold, lira) without and with DP-FedAvg; inversion (dlg)
# only where an upload is of few samples: FedSGD-like clients (one local step of B = 10), since a client's epoch here
# goes over ~3 000 images of 784 pixels, which DLG cannot separate. Then leakage_fmnist.md.
#   bash results/privacy/leakage_fmnist.sh        (from the repository root; Debian's dataset-fashion-mnist)
set -euo pipefail
out=results/privacy/leakage_fmnist
mkdir -p "$out"
sweep() {  # $1: the row's name, $2: the attacks, then its overrides
    local name=$1 attacks=$2; shift 2
    [ -e "$out/$name/sweep.csv" ] && return
    rm -rf "$out/$name"
    hetfed sweep configs/privacy_digits.yaml --seeds 3 --grid "leakage.kind=$attacks" --quiet \
        --set dataset.name=fashion-mnist --set train.rounds=30 --set name=privacy-fmnist --out "$out/$name" "$@"
    # kept: the tables (the runs' own folders hold checkpoints)
    find "$out/$name" -mindepth 1 -maxdepth 1 ! -name sweep.csv ! -name runs.csv ! -name table.md -exec rm -rf {} +
}
sweep none loss_threshold,lira
sweep dp_z0.5 loss_threshold,lira --set privacy.noise_multiplier=0.5
sweep fedsgd_1_step dlg --set train.local_steps=1
python results/privacy/leakage_table.py "$out" > "$out.md"
