#!/bin/bash
# A --jobs 2 sweep of 3 methods x 3 seeds, 1 round, on PFLlib's Fashion-MNIST split (MLP, Γ without its IID
# reference): wall and CPU seconds of the whole process tree. CHECKOUTS: the checkouts to alternate (their src/).
cd "$(dirname "$0")/../.."
m='[{name: fedavg, algorithm: fedavg}],[{name: fedprox, algorithm: fedprox}],[{name: local, algorithm: local}]'
for w in ${CHECKOUTS:-$PWD}; do
  out=$(mktemp -d)
  /usr/bin/time -f "$w wall %e s, cpu %U+%S s, maxrss %M KB" env PYTHONPATH=$w/src python -c "import sys; from hetfed.cli import entry; sys.argv[0]='hetfed'; entry()" \
    sweep configs/leaderboard_pfllib_fmnist.yaml --grid "methods=$m" --seeds 3 --jobs 2 --set train.rounds=1 \
    --set model.kind=mlp --set heterogeneity.iid_draws=0 --set train.eval_every=1 --out "$out/sweep" --quiet 2>&1 >/dev/null | tail -1
  rm -rf "$out"
done
