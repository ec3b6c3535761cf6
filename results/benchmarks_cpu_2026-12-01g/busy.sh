#!/bin/bash
# usage: busy.sh DIR LABEL TEST ; prints busy CPU-seconds of the whole machine and wall seconds
cd $1
read -r _ u n s i w q sq st _ < /proc/stat; b0=$((u+n+s+q+sq+st)); t0=$(date +%s.%N)
PYTHONPATH=$1/src OMP_NUM_THREADS=1 python -m pytest -q -n 0 -p no:cacheprovider "$3" > /tmp/busy_$2.log 2>&1; rc=$?
read -r _ u n s i w q sq st _ < /proc/stat; b1=$((u+n+s+q+sq+st)); t1=$(date +%s.%N)
echo "$2 rc=$rc busy_cpu_s=$(( (b1-b0)/100 )) wall_s=$(echo "$t1-$t0" | bc) $(tail -1 /tmp/busy_$2.log)"
