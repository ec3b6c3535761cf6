#!/usr/bin/env bash
# For the next lent GPU (this session's second call was refused): call.sh's tests (without -x: call 1 stopped at its
# first failure), then pFedMe, Per-FedAvg, FedDBE, FedALA and FedGen (their steps declared after call 1, so recorded)
# and the methods call 1's time limit left out, each alone on PFLlib's protocol for 4 rounds, FedAvg again as the
# reference; no stacked step; then benchmarks/repeats.py (does a FedBN sweep on CUDA repeat itself, with cuDNN's
# default and its deterministic algorithms — the cause of call 1's failed test; ~1 minute) and the norm screen's
# one synchronisation a stack and the client store's copies that do not wait (CUDA tests, seconds), and profile_round.py's lines that synchronise: at most
# 200 + 150 + 60 + 80 + 60 s of limits (run it with timeout_s ≈ 570).
#
#     OUT=/path bash results/gpu_h200_2026-12-04c/call2.sh
m='[{name: pfedme, algorithm: pfedme, params: {lam: 1.0, personal_lr: 0.01}}],'
m+='[{name: perfedavg, algorithm: perfedavg, params: {inner_lr: 0.005}, train: {local_epochs: 2}}],'
m+='[{name: fedavg, algorithm: fedavg}],[{name: feddbe, algorithm: feddbe}],[{name: fedproto, algorithm: fedproto}],'
m+='[{name: scaffold, algorithm: scaffold}],[{name: feddyn, algorithm: feddyn}],[{name: moon, algorithm: moon}],'
m+='[{name: fedlc, algorithm: fedlc}],[{name: fedala, algorithm: fedala}],[{name: fedgen, algorithm: fedgen}],'
m+='[{name: fedpac, algorithm: fedpac}],[{name: fedas, algorithm: fedas}]'  # declared after call 1 (last: if time)
METHODS=$m STACK_S=0 TESTS_S=${TESTS_S:-200} ALONE_S=${ALONE_S:-150} bash "$(dirname "$0")/call.sh"
cd "$(dirname "$0")/../.." && HETFED_TEST_DEVICE=cuda PYTHONPATH="$PWD/src:/tmp/site" timeout 60 python3 -m pytest -q -n0 \
    -p no:cacheprovider tests/server/test_robust.py tests/executors/test_scale.py tests/engine/test_streams.py -k "cuda or never_waits" \
    > "${OUT:-gpu-results}/tests_screen.txt" 2>&1
PYTHONPATH="$PWD/src:/tmp/site" timeout "${REPEATS_S:-80}" python3 benchmarks/repeats.py \
    --device cuda > "${OUT:-gpu-results}/repeats.json" 2> "${OUT:-gpu-results}/repeats.log"
# where the overhead-bound (CGAU setting) round waits on the GPU, line by line (#74 item 3)
PYTHONPATH="$PWD/src:/tmp/site" timeout 60 python3 benchmarks/profile_round.py --device cuda --rounds 3 --top 15 \
    > "${OUT:-gpu-results}/profile_round.json" 2> "${OUT:-gpu-results}/profile_round.log"
