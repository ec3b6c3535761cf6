#!/usr/bin/env bash
# Every GPU measurement #47 asks for, in one go, for a session that is lent a GPU (~3 minutes on an H100):
# - the CUDA tests: streams bit-identical to the CPU's, an eager step loop that never synchronises, CUDA-graph
#   replays = eager steps (tests/engine/test_capture.py);
# - the equal-client workloads (W1, the CGAU setting, Fed-FSNet's MNIST protocol) with train.capture on and off,
#   and their stacked ideal eager and captured as a CUDA graph (engine.py);
# - the unequal workload's round with its stacked ideal and GEMM limit (unequal.py);
# - stacked sweeps of 1, 5 and 20 seeds (stacked_sweep.py; with BASE_SRC also another commit's), and where a sweep's time
#   goes on every thread (profile_sweep.py);
# - the unequal workload on PFLlib's CNN (cnn4) with its stacked ideal and conv limit (unequal.py --model cnn4);
# - with PFLLIB set, PFLlib's own loop on the same federation and device, MLP and cnn4 (peers.py); with PFL=1 also
#   pfl-research's simulation (its wheels and theirs installed: see peers.py);
# - asynchronous FedBuff/FedAsync throughput and QSGD's cost on W1 (asynchronous.py); Flower's Simulation Engine on
#   the same workloads as hetfed's executors (engines.py: needs flwr and a Ray carried, see flower_sim below);
# - the papers' protocols on real data, a few rounds each (protocols.py: Fed-FSNet MNIST f = 1, FedMoE FMNIST,
#   PFLlib's cnn4 leaderboard protocol), and profiles of W1's and Fed-FSNet's rounds (profile_round.py).
# STEPS="engine protocols …" runs only the steps named; LIMIT_flower_sim=200 (say) gives a step another time limit.
# One JSON per step, steps.txt and errors.log go to $OUT (default ./gpu-results). Each step has a time limit; a failure is recorded and the next step still runs.
#
#     OUT=/path PFLLIB=/path/to/PFLlib/system bash benchmarks/gpu.sh
#
# The device machine has no hetfed install and no network: the source is read from src/ (PYTHONPATH). Its image
# lacks pydantic, flwr and Ray: `bash benchmarks/gpu_carry.sh` packs them for it (.carry/site312.tar.xz, ~34 MB);
# carry .carry and begin the call with `tar xJf .carry/site312.tar.xz -C /tmp && export PYTHONPATH=/tmp/site312`.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-gpu-results}
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/steps.txt" 2>&1
$py -c "import torch, sys; print(sys.version, torch.__version__, torch.version.cuda)" >> "$out/steps.txt" 2>&1
step() {  # name, seconds (LIMIT_<name> replaces them: fit the steps to a session's device time), command…
    local name=$1 var="LIMIT_$1"; local limit=${!var:-$2}; shift 2
    local t0=$SECONDS
    echo "== $name" >> "$out/errors.log"
    if timeout "$limit" "$@" > "$out/$name.json" 2>> "$out/errors.log"; then status=ok; else status="failed ($?)"; fi
    echo "$name: $status in $((SECONDS - t0)) s" | tee -a "$out/steps.txt"
}
want() { [ -z "${STEPS:-}" ] || [[ " $STEPS " == *" $1 "* ]]; }
want cuda_tests && step cuda_tests 240 $py -m pytest -q -n0 -p no:cacheprovider tests/engine/test_capture.py tests/engine/test_streams.py tests/server/test_compression.py tests/executors/test_async.py tests/flower/test_flower_simulation.py tests/executors/test_scale.py -k "cuda or bit_identical or synchronises"
want engine && step engine 120 bash -c "cd benchmarks && $py engine.py --device cuda --rounds 2 --threads 4 --json --cases compute_bound overhead_bound fsnet_protocol"
want unequal && step unequal 120 bash -c "cd benchmarks && $py unequal.py --device cuda --rounds 2 --threads 4 --json"
want unequal_cnn4 && step unequal_cnn4 150 bash -c "cd benchmarks && $py unequal.py --device cuda --rounds 2 --threads 4 --json --model cnn4 --algorithms fedavg --executors sequential vectorised"
# the papers' protocols on real data: MNIST and Fashion-MNIST where hetfed finds them ($HETFED_DATA/<name>)
want protocols && step protocols 200 bash -c "cd benchmarks && $py protocols.py --device cuda --rounds 5 --threads 4"
if [ -n "${PFLLIB:-}" ]; then
    want peers && step peers 100 bash -c "cd benchmarks && $py peers.py --pfllib '$PFLLIB' --device cuda --rounds 2 --threads 4 ${PFL:+--pfl}"
    want peers_cnn4 && step peers_cnn4 120 bash -c "cd benchmarks && $py peers.py --pfllib '$PFLLIB' --device cuda --rounds 2 --threads 4 --model cnn4 --algorithms fedavg"
fi
want profile_w1 && step profile_w1 60 bash -c "cd benchmarks && $py profile_round.py --device cuda --case compute_bound --rounds 5"
want profile_fsnet && step profile_fsnet 60 bash -c "cd benchmarks && $py profile_round.py --device cuda --case fsnet_protocol --algorithm fsnet --rounds 2"
want stacked_sweep && step stacked_sweep 120 bash -c "cd benchmarks && $py stacked_sweep.py --device cuda --rounds 10 --seeds 1 5 20 --threads 4"
# with BASE_SRC (another commit's src/), the same sweeps with that code on the same machine, for a before/after
if [ -n "${BASE_SRC:-}" ]; then
    want stacked_sweep_base && step stacked_sweep_base 120 bash -c "cd benchmarks && PYTHONPATH='$BASE_SRC':\$PYTHONPATH $py stacked_sweep.py --device cuda --rounds 10 --seeds 1 5 20 --threads 4"
fi
# #74's setting (logistic regression, 10 Dirichlet clients, evaluation every round): a stacked round of 1, 5 and 20
# seeds, its marginal ms and the floor of its client work
want stacked_per_round && step stacked_per_round 150 bash -c "cd benchmarks && $py stacked_sweep.py --device cuda --per-round --rounds 40 --seeds 1 5 20 --threads 4 --set model.kind=logreg --set partition.kind=dirichlet --set partition.alpha=0.5 --set train.eval_every=1 --set 'methods=[{name: fedavg, algorithm: fedavg}]'"
# 20 stacked seeds against one at the default experiment's full length (100 rounds), stacked sweeps only
want stacked_sweep_full && step stacked_sweep_full 240 bash -c "cd benchmarks && $py stacked_sweep.py --device cuda --rounds 100 --seeds 1 20 --threads 4 --stacked-only"
# a stacked sweep (rounds and evaluations joined across runs) = the same sweep one by one, on the GPU: the default
# experiment's methods, every registered algorithm (2 rounds each: a method that fails on CUDA fails it), the methods
# whose server sends more than a model
want stacked_tests && step stacked_tests 240 env HETFED_TEST_DEVICE=cuda $py -m pytest -q -n0 -p no:cacheprovider tests/runs/test_stacked_sweep.py tests/engine/test_client_scores.py -k "one_by_one or scores or every_registered or more_than_a_model"
# asynchronous FedBuff / FedAsync against synchronous FedAvg, and QSGD's cost on W1, on the GPU (the torch path)
want async && step async 150 bash -c "cd benchmarks && $py asynchronous.py --device cuda --repeats 3 --threads 4"
# Flower's Simulation Engine (one client per node, each ClientApp a Ray process on the one GPU) next to hetfed's
# executors on the same workloads: needs flwr and Ray on PYTHONPATH (benchmarks/gpu_carry.sh)
want flower_sim && step flower_sim 300 bash -c "cd benchmarks && $py engines.py --device cuda --cases cgau mlp --engines vectorised flower --json"
# where a sweep's time goes on every thread (a sampling profiler), stacked and one by one
want profile_sweep && step profile_sweep 90 bash -c "cd benchmarks && $py profile_sweep.py --device cuda --seeds 20 --rounds 10 --stack --threads 4"
want profile_sweep_one && step profile_sweep_one 90 bash -c "cd benchmarks && $py profile_sweep.py --device cuda --seeds 5 --rounds 10 --threads 4"
