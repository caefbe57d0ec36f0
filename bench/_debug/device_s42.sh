#!/bin/bash
# Session 42 (16 cores): the replayer's message fast path and the clock's one lookup per op, against
# the tree before them (copied to _base/, untracked), alternated, on pp 1F1B at its default size
# (2 x 1 x 2 as sessions 37 and 40 ran it): its emulation added 2.4-4.2 ms per step over its timed
# graph, the vranks' offsets drifting by as much (bench/_debug/anchor_drift.py). Each run directory
# is kept and read here with anchor_drift.py, then packed into $OUT. Then LONG examples on the new
# tree as bench/_debug/device_s40.sh runs them. VARIANTS (default "new base"): also "sw50", the new
# tree with the replayer's GIL switch interval at 50 us instead of 200 (a copy in /tmp, sed-edited).
# Usage (device tool):  AB_ROUNDS=2 LONG="pp-sleep" LIMIT_S=<limit> bash bench/_debug/device_s42.sh
T0=$(date +%s)
ROOT=$PWD
LIMIT=${LIMIT_S:-575}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
KEEP=/tmp/prism_s42_keep
if [[ " ${VARIANTS:-new base} " == *" sw50 "* ]]; then
  mkdir -p /tmp/sw50 && tar -C $ROOT --exclude=./_base --exclude=./bench/results -cf - . | tar -C /tmp/sw50 -xf -
  sed -i 's/^_SWITCH_INTERVAL_S = 2e-4/_SWITCH_INTERVAL_S = 5e-5/' /tmp/sw50/prism/vrank_replayer/replayer.py
  grep -n "^_SWITCH_INTERVAL_S" /tmp/sw50/prism/vrank_replayer/replayer.py
fi
for i in $(seq 1 ${AB_ROUNDS:-2}); do
  for t in ${VARIANTS:-new base}; do
    L=$(left); [ $L -lt 100 ] && { echo "skip $t $i: ${L}s left"; continue; }
    d=$ROOT; [ $t = base ] && d=$ROOT/_base; [ $t = sw50 ] && d=/tmp/sw50
    o=$OUT/ef_pp-1f1b_short_${t}_$i; k=$KEEP/${t}_$i
    (cd $d && PYTHONPATH=$d timeout $(( L - 10 )) python bench/emulate_fidelity.py --examples pp-1f1b --sizes default --device-path host --parallel 1 --slice-size 4 --calibration-repeats 1 --repeats 2 --real-repeats 2 --budget-s $(( L - 20 )) --first-job-s 60 --keep $k --out $o.json > /tmp/ef_${t}_$i.log 2>&1)
    echo "== pp-1f1b short $t $i t=$(( $(date +%s)-T0 ))"; grep -E " r[0-9]+: |skipped|FAILED|Error" /tmp/ef_${t}_$i.log
    PYTHONPATH=$ROOT python bench/_debug/fidelity_steps.py $o.json
    PYTHONPATH=$ROOT timeout 60 python bench/_debug/anchor_drift.py $k/pp-1f1b-default
    tar -C $k -cJf $OUT/keep_pp-1f1b_short_${t}_$i.tar.xz --exclude=payloads --exclude=capture --exclude=outputs --exclude='*.log' pp-1f1b-default
    rm -rf $k
  done
done
export PYTHONPATH=$ROOT
for ex in $LONG; do
  L=$(left)
  [ $L -lt 150 ] && { echo "skip $ex: ${L}s left"; continue; }
  o=$OUT/ef_${ex}; lg=/tmp/ef_${ex}.log
  timeout $(( L - 15 )) python bench/emulate_fidelity.py --examples $ex --sizes long --device-path host --warmup-steps 2 --parallel 1 --slice-size 4 --calibration-repeats 3 --repeats 3 --real-repeats 3 --budget-s $(( L - 25 )) --first-job-s 130 --keep $KEEP --out $o.json > $lg 2>&1
  echo "== $ex t=$(( $(date +%s)-T0 ))"; grep -E " r[0-9]+: |skipped|FAILED|Error" $lg
  python bench/_debug/fidelity_steps.py $o.json
  tar -C $KEEP -cJf $OUT/keep_${ex}.tar.xz --exclude=payloads --exclude=capture --exclude=outputs --exclude='*.log' $ex-long
  rm -rf $KEEP/$ex-long
done
