#!/usr/bin/env bash
# What the server learns against what each method gains (#76), digits, 3 seeds per cell: every defence of
# configs/privacy_digits.yaml, each a sweep over the three attacks (loss_threshold, lira, dlg); then the table (leakage_digits.md).
#   bash results/privacy/leakage_digits.sh        (from the repository root; ~10 min on this project's 2-core CPU)
set -euo pipefail
out=results/privacy/leakage_digits
mkdir -p "$out"
sweep() {  # $1: the defence's name, then its overrides
    local name=$1; shift
    [ -e "$out/$name/sweep.csv" ] && return
    rm -rf "$out/$name"
    hetfed sweep configs/privacy_digits.yaml --seeds 3 --grid leakage.kind=loss_threshold,lira,dlg --quiet \
        --out "$out/$name" "$@"
    # kept: the tables (the runs' own folders hold checkpoints: ~30 MB a defence)
    find "$out/$name" -mindepth 1 -maxdepth 1 ! -name sweep.csv ! -name runs.csv ! -name table.md -exec rm -rf {} +
}
sweep none
sweep dp_z0.5 --set privacy.noise_multiplier=0.5
sweep qsgd_2bit --set server.compression.kind=qsgd --set server.compression.bits=2
sweep topk_10pct --set server.compression.kind=topk --set server.compression.fraction=0.1
sweep local_epochs_5 --set train.local_epochs=5
sweep fedsgd_1_step --set train.local_steps=1      # the reference: an upload of one step over B = 10 samples
# record-level DP-SGD in every local step: the methods of plain steps (FedRep's and FedMoE's phases are refused)
sweep dp_sgd_s1 --set privacy.record.noise_multiplier=1.0 --set 'methods=[{name: fedavg, algorithm: fedavg},
    {name: fedprox, algorithm: fedprox, params: {mu: 0.01}}, {name: ditto, algorithm: ditto, params: {lam: 0.1}},
    {name: cgau, algorithm: fedavg, model: {kind: cgau, hidden: [64, 64]}}]'
python results/privacy/leakage_table.py "$out" > "$out.md"
