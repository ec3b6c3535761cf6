#!/usr/bin/env bash
# The third GPU session of 2026-12-04 (a lent H200), one device call, carrying .whl (pydantic's wheels) and .data
# (Fashion-MNIST's IDX files):
#   1. the CUDA tests of the capture (the declared objectives' CUDA graphs = eager, new) and the stacked sweeps (every
#      registered algorithm one by one = stacked, 2 rounds; under attack; the clients' scores) on CUDA;
#   2. every method of PFLlib's Fashion-MNIST table that hetfed has, plus SCAFFOLD, FedDyn, MOON and FedLC, each alone
#      on PFLlib's protocol (configs/leaderboard_pfllib_fmnist.yaml) for 4 rounds in one run: each method's seconds a
#      round (summary.json), the recordings' warm-up included;
#   3. FedAvg, FedPer, FedRoD and Ditto stacked for 4 rounds (12.4 s a round in the second session's call 2).
#
# METHODS (a --grid value) replaces step 2's methods; STACK_S=0 leaves step 3 out; TESTS_S, ALONE_S: time limits.
#
#     OUT=/path bash results/gpu_h200_2026-12-04c/call.sh
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-results}
mkdir -p "$out"
python3 -c "import pydantic" 2>/dev/null || for w in .whl/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done
export PYTHONPATH="$PWD/src:/tmp/site" PYTHONUNBUFFERED=1 HETFED_DATA=$PWD/.data OMP_NUM_THREADS=4
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; \
  python3 -c "import torch, sys; print(sys.version, torch.__version__, torch.version.cuda)"; } > "$out/steps.txt" 2>&1
t0=$SECONDS
timeout "${TESTS_S:-200}" env HETFED_TEST_DEVICE=cuda python3 -m pytest -q -n0 -p no:cacheprovider \
    tests/engine/test_capture.py tests/runs/test_stacked_sweep.py tests/engine/test_client_scores.py \
    -k "cuda or another_thread or one_by_one or scores or every_registered or more_than_a_model or under_attack" \
    > "$out/tests.txt" 2>&1
echo "tests rc=$? at $((SECONDS - t0)) s" >> "$out/steps.txt"
mkdir -p /tmp/bin && printf '%s\n' '#!/bin/sh' \
    'exec python3 -c "import sys; from hetfed.cli import entry; sys.argv[0] = \"hetfed\"; entry()" "$@"' > /tmp/bin/hetfed
chmod +x /tmp/bin/hetfed && export PATH=/tmp/bin:$PATH
common=(--set train.device=${DEVICE:-cuda} --set heterogeneity.iid_draws=0 --set train.checkpoint_every=null
        --set train.eval_every=4 --set train.rounds=${ROUNDS:-4} --no-report --quiet --seeds 1)
m=${METHODS:-}
[ -n "$m" ] || m='[{name: fedavg, algorithm: fedavg}],[{name: fedprox, algorithm: fedprox, params: {mu: 0.01}}],'
[ -n "${METHODS:-}" ] || m+='[{name: fedgen, algorithm: fedgen}],'
[ -n "${METHODS:-}" ] || m+='[{name: perfedavg, algorithm: perfedavg, params: {inner_lr: 0.005}, train: {local_epochs: 2}}],'
[ -n "${METHODS:-}" ] || m+='[{name: pfedme, algorithm: pfedme, params: {lam: 1.0, personal_lr: 0.01}}],'
[ -n "${METHODS:-}" ] || m+='[{name: ditto, algorithm: ditto, params: {lam: 0.1}}],[{name: apfl, algorithm: apfl}],'
[ -n "${METHODS:-}" ] || m+='[{name: fedfomo, algorithm: fedfomo}],[{name: fedala, algorithm: fedala}],[{name: fedper, algorithm: fedper}],'
[ -n "${METHODS:-}" ] || m+='[{name: fedrep, algorithm: fedrep}],[{name: fedrod, algorithm: fedrod}],[{name: fedbabu, algorithm: fedbabu}],'
[ -n "${METHODS:-}" ] || m+='[{name: fedcp, algorithm: fedcp}],[{name: gpfl, algorithm: gpfl}],[{name: feddbe, algorithm: feddbe}],'
[ -n "${METHODS:-}" ] || m+='[{name: fedproto, algorithm: fedproto}],[{name: scaffold, algorithm: scaffold}],[{name: feddyn, algorithm: feddyn}],'
[ -n "${METHODS:-}" ] || m+='[{name: moon, algorithm: moon}],[{name: fedlc, algorithm: fedlc}]'
timeout "${ALONE_S:-220}" hetfed sweep configs/leaderboard_pfllib_fmnist.yaml "${common[@]}" --grid "methods=$m" \
    --out "$out/alone" > "$out/alone.log" 2>&1
echo "alone rc=$? at $((SECONDS - t0)) s" >> "$out/steps.txt"
python3 - "$out" > "$out/alone_seconds.json" 2>> "$out/alone.log" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1], "alone").rglob("summary.json"), key=lambda f: f.stat().st_mtime):
    for name, s in json.load(open(f)).get("methods", {}).items():
        print(json.dumps({"method": name, **{k: s.get(k) for k in ("seconds_per_round", "server_seconds_per_round",
                                                                       "eval_seconds_per_evaluation", "wall_seconds")}}))
PY
methods='[{name: fedavg, algorithm: fedavg}],[{name: fedper, algorithm: fedper}],[{name: fedrod, algorithm: fedrod}],'
methods+='[{name: ditto, algorithm: ditto, params: {lam: 0.1}}]'
[ "${STACK_S:-90}" = 0 ] || timeout "${STACK_S:-90}" hetfed sweep configs/leaderboard_pfllib_fmnist.yaml "${common[@]}" --grid "methods=$methods" \
    --stack --out "$out/stack4" > "$out/stack4.log" 2>&1
echo "stack4 rc=$? at $((SECONDS - t0)) s" >> "$out/steps.txt"
tar cf - --exclude=checkpoints --exclude=figures --exclude=federation.npz -C "$out" alone stack4 2>/dev/null \
    | xz -6 > "$out/runs.tar.xz"; rm -rf "$out/alone" "$out/stack4"
