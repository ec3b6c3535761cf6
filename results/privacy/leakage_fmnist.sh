#!/usr/bin/env bash
# Membership against accuracy on Fashion-MNIST (#76), 3 seeds per cell: configs/privacy_digits.yaml on
# Fashion-MNIST at the leaderboard's budget (30 rounds), without and with DP-FedAvg, each a sweep over the two
# membership attacks. No inversion here: a client's round-1 upload goes over ~3 000 images of 784 pixels, which DLG
# cannot separate (digits' clients of ~16–70 samples are where it is measured). Then leakage_fmnist.md.
#   bash results/privacy/leakage_fmnist.sh        (from the repository root; Debian's dataset-fashion-mnist)
set -euo pipefail
out=results/privacy/leakage_fmnist
mkdir -p "$out"
sweep() {  # $1: the defence's name, then its overrides
    local name=$1; shift
    [ -e "$out/$name/sweep.csv" ] && return
    rm -rf "$out/$name"
    hetfed sweep configs/privacy_digits.yaml --seeds 3 --grid leakage.kind=loss_threshold,lira --quiet \
        --set dataset.name=fashion-mnist --set train.rounds=30 --set name=privacy-fmnist --out "$out/$name" "$@"
    # kept: the tables (the runs' own folders hold checkpoints)
    find "$out/$name" -mindepth 1 -maxdepth 1 ! -name sweep.csv ! -name runs.csv ! -name table.md -exec rm -rf {} +
}
sweep none
sweep dp_z0.5 --set privacy.noise_multiplier=0.5
python results/privacy/leakage_table.py "$out" > "$out.md"
