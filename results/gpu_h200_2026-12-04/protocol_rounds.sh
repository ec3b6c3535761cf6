#!/usr/bin/env bash
# PFLlib's Fashion-MNIST protocol (configs/leaderboard_pfllib_fmnist.yaml) for a few rounds on the lent GPU: what a
# round costs one seed with train.capture auto and off, 3 seeds stacked, and Per-FedAvg (its evaluation adapts every
# client). Each run's summary.json and log packed into $OUT/protocol_rounds.tar.xz.
#
#     OUT=/path bash results/gpu_h200_2026-12-04/protocol_rounds.sh       (ROUNDS=4 DEVICE=cuda DATASET=fashion-mnist)
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-protocol-results}
mkdir -p "$out/p"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HETFED_DATA=${HETFED_DATA:-$PWD/.data}
py=${PYTHON:-python3}
rounds=${ROUNDS:-4}
h=("$py" -c "import sys; from hetfed.cli import entry; sys.argv[0] = 'hetfed'; entry()")
common=(configs/leaderboard_pfllib_fmnist.yaml --set train.device="${DEVICE:-cuda}" --set dataset.name="${DATASET:-fashion-mnist}"
        --set heterogeneity.iid_draws=0 --set train.checkpoint_every=null --set train.rounds="$rounds" --no-report)
fedavg='[{name: fedavg, algorithm: fedavg}]'
t0=$SECONDS
for cap in auto off; do
    timeout "${LIMIT:-100}" "${h[@]}" run "${common[@]}" --set "methods=$fedavg" --set train.capture=$cap --out "$out/p/fedavg_$cap" \
        > "$out/p/fedavg_$cap.log" 2>&1
    echo "fedavg capture=$cap rc=$? at $((SECONDS - t0)) s" | tee -a "$out/steps.txt"
done
timeout "${LIMIT:-100}" "${h[@]}" sweep "${common[@]}" --grid "methods=$fedavg" --seeds 3 --stack --out "$out/p/fedavg_stack3" \
    > "$out/p/fedavg_stack3.log" 2>&1
echo "fedavg 3 seeds stacked rc=$? at $((SECONDS - t0)) s" | tee -a "$out/steps.txt"
timeout "${LIMIT:-100}" "${h[@]}" run "${common[@]}" --set 'methods=[{name: perfedavg, algorithm: perfedavg}]' --set train.rounds=2 \
    --out "$out/p/perfedavg" > "$out/p/perfedavg.log" 2>&1
echo "perfedavg rc=$? at $((SECONDS - t0)) s" | tee -a "$out/steps.txt"
tar cf - --exclude=checkpoints --exclude=figures --exclude=federation.npz -C "$out" p | xz -6 > "$out/protocol_rounds.tar.xz"
rm -rf "$out/p"
