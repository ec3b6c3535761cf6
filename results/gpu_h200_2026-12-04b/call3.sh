#!/usr/bin/env bash
# Why PFLlib's protocol stacked as four methods (FedAvg, FedPer, FedRoD, Ditto; call.sh) took ~12.4 s a round on the
# H200 when FedAvg alone takes ~0.84: each method alone for 4 rounds (its summary.json's seconds a round), then the
# four stacked under benchmarks/profile_sweep.py (where the time goes, on every thread). Carry .whl and .data.
#
#     OUT=/path bash results/gpu_h200_2026-12-04b/call3.sh
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-results}
mkdir -p "$out"
for w in .whl/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
export PYTHONPATH="$PWD/src:/tmp/site" PYTHONUNBUFFERED=1 HETFED_DATA=$PWD/.data OMP_NUM_THREADS=4
common=(--set train.device=cuda --set heterogeneity.iid_draws=0 --set train.checkpoint_every=null
        --set train.eval_every=5 --set train.rounds=4)
t0=$SECONDS
for m in fedavg fedper fedrod ditto; do
    params=$([ $m = ditto ] && echo ", params: {lam: 0.1}")
    timeout 40 python3 -c "import sys; from hetfed.cli import entry; sys.argv[0] = 'hetfed'; entry()" run \
        configs/leaderboard_pfllib_fmnist.yaml "${common[@]}" --set "methods=[{name: $m, algorithm: $m$params}]" \
        --no-report --quiet --out "$out/alone_$m" > "$out/alone_$m.log" 2>&1
    echo "$m alone rc=$? at $((SECONDS - t0)) s" >> "$out/steps.txt"
    cp "$out/alone_$m/summary.json" "$out/alone_$m.json" 2>/dev/null; rm -rf "$out/alone_$m"
done
methods='[{name: fedavg, algorithm: fedavg}],[{name: fedper, algorithm: fedper}],[{name: fedrod, algorithm: fedrod}],'
methods+='[{name: ditto, algorithm: ditto, params: {lam: 0.1}}]'
(cd benchmarks && timeout 110 python3 profile_sweep.py --device cuda --threads 4 --seeds 1 --rounds 4 --stack --top 60 \
    --config ../configs/leaderboard_pfllib_fmnist.yaml --set heterogeneity.iid_draws=0 --set train.checkpoint_every=null \
    --set train.eval_every=5 --grid "methods=$methods" > "$out/profile_stack4.json" 2> "$out/profile_stack4.err")
echo "profile rc=$? at $((SECONDS - t0)) s" >> "$out/steps.txt"
