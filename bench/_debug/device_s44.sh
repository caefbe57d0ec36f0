#!/bin/bash
# Session 44's device call (16 cores): a group of two with one vrank exchanges once per all-reduce,
# all-gather and reduce-scatter (prism/nccl_patches/pair.py) instead of running prism's ring on the
# sandbox rank's channel thread. Per job in LONG: bench/emulate_fidelity.py at the long size (3 x 3 x 3,
# W=8, sandbox {2,5}, host path, the new default), its run directory kept; then on that directory AB_ROUNDS
# rounds of two alternated emulations, PRISM_PAIR_EXCHANGE=1 (the default) and =0 (the ring, as before),
# each printed against the timed graph's prediction; then bench/_debug/pair_timing.py (the 2-rank ops from
# the later issue to completion: real runs, takes, every emulation in order). The run directory without
# payloads is packed into $OUT/keep_<job>.tar.xz.
# Usage (device tool):  LONG="tp-sleep hybrid-sleep" AB_ROUNDS=2 LIMIT_S=580 bash bench/_debug/device_s44.sh
export PYTHONPATH=$PWD
T0=$(date +%s)
LIMIT=${LIMIT_S:-580}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
KEEP=/tmp/prism_s44_keep
for ex in $LONG; do
  L=$(left)
  [ $L -lt 150 ] && { echo "skip $ex: ${L}s left"; continue; }
  o=$OUT/ef_${ex}; lg=/tmp/ef_${ex}.log
  timeout $(( L - 15 )) python bench/emulate_fidelity.py --examples $ex --sizes long --device-path host --warmup-steps 2 --parallel 1 --slice-size 4 --calibration-repeats 3 --repeats 3 --real-repeats 3 --budget-s $(( L - 25 )) --first-job-s 130 --keep $KEEP --out $o.json > $lg 2>&1
  echo "== $ex t=$(( $(date +%s)-T0 ))"; grep -E " r[0-9]+: |skipped|FAILED|Error" $lg
  python bench/_debug/fidelity_steps.py $o.json
  R=$KEEP/$ex-long
  for i in $(seq 1 ${AB_ROUNDS:-2}); do
    for pairs in 1 0; do
      L=$(left); [ $L -lt 60 ] && { echo "skip A/B $ex $i pairs=$pairs: ${L}s left"; continue; }
      PRISM_PAIR_EXCHANGE=$pairs timeout $(( L - 20 )) python -m prism.cli.main emulate $R --ranks 2,5 --device-path host --json > /tmp/ab_${ex}_${pairs}_$i.json 2> /tmp/ab_${ex}_${pairs}_$i.err
      python - /tmp/ab_${ex}_${pairs}_$i.json "pairs=$pairs round $i" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except ValueError:
    print(sys.argv[2], "failed"); sys.exit()
print(sys.argv[2], {k: (round(v["mean_ms"], 2), round(v["predicted_mean_ms"], 2)) for k, v in r["ranks"].items()})
PY
      tail -3 /tmp/ab_${ex}_${pairs}_$i.err | grep -iE "error|failed" || true
    done
  done
  echo "-- emulations in order (the benchmark's 3 with pairs, then the A/B rounds: pairs=1, pairs=0, ...)"
  for r in 2 5; do timeout 60 python bench/_debug/pair_timing.py $R $r --skip 2; done
  tar -C $KEEP -cJf $OUT/keep_${ex}.tar.xz --exclude=payloads --exclude=capture --exclude=outputs --exclude='*.log' $ex-long
  rm -rf $R
done
