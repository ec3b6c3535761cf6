# $1: src path, $2: out
cd /work/main && . .venv/bin/activate
export PYTHONPATH=$1
s=$(date +%s.%N)
python -c "import sys; from hetfed.cli import entry; sys.argv[0]='hetfed'; entry()" sweep configs/leaderboard_pfllib_fmnist.yaml --set dataset.name=digits --set train.rounds=5 --set train.device=cpu --set heterogeneity.iid_draws=0 --set train.checkpoint_every=null --seeds 3 --stack --quiet --out $2 > /dev/null 2>&1
e=$(date +%s.%N)
echo "$1 $(echo "$e - $s" | bc)"
