#!/usr/bin/env bash
# The second GPU session of 2026-12-04 (a lent H200), in one device call, carrying .whl (pydantic's wheels) and .data
# (Fashion-MNIST's four IDX files):
#   1. the CUDA-graph capture fix (56f29e9) checked where it failed: the capture tests and the stacked sweeps under
#      attack and under FLTrust, one by one = stacked, on CUDA;
#   2. cnn4's step in each convolution form, eager and replayed from a CUDA graph (benchmarks/conv_forms.py --capture);
#   3. PFLlib's Fashion-MNIST protocol (configs/leaderboard_pfllib_fmnist.yaml), one seed, FedAvg, FedPer, FedRoD
#      and Ditto stacked, 2 000 rounds configured, evaluated every 5 rounds, stopped by a time budget (SIGTERM after
#      PROTOCOL_S seconds): each run's metrics.csv (every evaluation so far) packed into $OUT/protocol.tar.xz, read
#      with `python results/tables.py pfllib DIR`.
#
#     OUT=/path bash results/gpu_h200_2026-12-04b/call.sh          (PROTOCOL_S=240)
set -u
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-results}
mkdir -p "$out"
for w in .whl/*.whl; do python3 -m zipfile -e "$w" /tmp/site; done  # wheels are zip files: unpacked, nothing to resolve
export PYTHONPATH="$PWD/src:/tmp/site" PYTHONUNBUFFERED=1 HETFED_DATA=$PWD/.data OMP_NUM_THREADS=4
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; git log --oneline -1; \
  python3 -c "import torch, sys; print(sys.version, torch.__version__, torch.version.cuda)"; } > "$out/steps.txt" 2>&1
t0=$SECONDS
timeout 120 env HETFED_TEST_DEVICE=cuda python3 -m pytest -q -n0 -p no:cacheprovider tests/engine/test_capture.py \
    tests/runs/test_stacked_sweep.py -k "cuda or another_thread or under_attack or fltrust" > "$out/tests.txt" 2>&1
echo "tests rc=$? at $((SECONDS - t0)) s" >> "$out/steps.txt"
timeout 60 python3 benchmarks/conv_forms.py --device cuda --clients 1 7 20 --batch 10 --capture > "$out/conv_forms.json" \
    2> "$out/conv_forms.err"
echo "conv_forms rc=$? at $((SECONDS - t0)) s" >> "$out/steps.txt"
methods='[{name: fedavg, algorithm: fedavg}],[{name: fedper, algorithm: fedper}],[{name: fedrod, algorithm: fedrod}],'
methods+='[{name: ditto, algorithm: ditto, params: {lam: 0.1}}]'
timeout -s TERM "${PROTOCOL_S:-240}" python3 -c "import sys; from hetfed.cli import entry; sys.argv[0] = 'hetfed'; entry()" \
    sweep configs/leaderboard_pfllib_fmnist.yaml --set train.device=cuda --set heterogeneity.iid_draws=0 \
    --set train.checkpoint_every=null --set train.eval_every=5 --grid "methods=$methods" --seeds 1 --stack \
    --no-report --out "$out/p" > "$out/protocol.log" 2>&1
echo "protocol rc=$? at $((SECONDS - t0)) s" >> "$out/steps.txt"
tar cf - --exclude=checkpoints --exclude=figures --exclude=federation.npz -C "$out" p | xz -6 > "$out/protocol.tar.xz"
rm -rf "$out/p"
