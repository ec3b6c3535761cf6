#!/usr/bin/env bash
# What the server learns on Flower's Simulation Engine (#76): DLG on client 0's round-1 update as the ServerApp
# receives it — the client's own (one client a node), its node's cohort mean (4 clients a node), only the round's
# mean (SecAgg+, 20 nodes) — configs/privacy_digits.yaml's federation and methods (FedMoE's fedavg row is FedAvg),
# FedSGD-like uploads (one step of B = 10, the in-process tables' `fedsgd_1_step` reference), 3 seeds, on digits and
# on Fashion-MNIST; one round (the attack reads round 1; the accuracy is not the point here). Then the tables
# (leakage_flower.md, leakage_flower_fmnist.md).
#   bash results/privacy/leakage_flower.sh        (from the repository root; ~30 min on this project's 2-core CPU)
set -euo pipefail
sweep() {  # $1: the protocol's name, then its overrides
    local name=$1; shift
    [ -e "$out/$name/sweep.csv" ] && return
    rm -rf "$out/$name"
    hetfed sweep configs/privacy_digits.yaml --seeds 3 --quiet --out "$out/$name" \
        --set train.executor=flower --set train.rounds=1 --set train.local_steps=1 --set train.eval_every=1 \
        --set leakage.kind=dlg --set flower.connect_timeout=300 "$@"
    find "$out/$name" -mindepth 1 -maxdepth 1 ! -name sweep.csv ! -name runs.csv ! -name table.md -exec rm -rf {} +
}
protocols() {  # the three protocols on one dataset, then its table; $@: the dataset's overrides
    mkdir -p "$out"
    sweep one_client_a_node "$@"
    sweep four_clients_a_node --set flower.clients_per_node=4 "$@"
    sweep secaggplus --set flower.secure_aggregation=secaggplus "$@"
    python results/privacy/leakage_table.py "$out" dlg > "$out.md"
}
out=results/privacy/leakage_flower protocols
out=results/privacy/leakage_flower_fmnist protocols --set dataset.name=fashion-mnist --set name=privacy-fmnist
