#!/bin/bash
# Session 40's device call (16 cores): the long-step examples in LONG at 3 x 3 x 3, W=8, sandbox {2,5},
# host path, unpinned, run directories kept: each rank's compute and the rest of its step in every source
# (bench/_debug/take_compute.py: real runs, each calibration take, the timed graph, each emulation), the
# sandbox ranks' waits by op (wait_kinds.py), and the run directory without its payloads packed into
# $OUT/keep_<example>.tar.xz for reading here (STATUS Next 1-2 of session 39: fsdp2's real time outside
# compute, pp-interleaved's calibration miss). Then SHORT examples, kept and packed the same way, at their default sizes, 2 x 1 x 2, as session 37 ran them
# (its warm-up steps, not 2), with the cost per comm op (pp 1F1B: +39 %, +0.17 ms per op then).
# REPLAYERS=N (session 43): each emulation's replayer processes (bench/emulate_fidelity.py --replayers; unset: 1).
# MERGE=median|rotated: prism calibrate --merge of every calibration (unset: the benchmark's default,
# prism's DEFAULT_MERGE, since session 42; each JSON reports the other merges beside it); SHORT_TAKES: calibration takes of the short jobs (1). ANALYZE=0 (session 41) leaves
# take_compute and wait_kinds to this machine, on the packed run directory, to save device time.
# Usage (device tool):  LONG="fsdp2-sleep" SHORT="pp-1f1b" LIMIT_S=<limit> bash bench/_debug/device_s40.sh
export PYTHONPATH=$PWD
T0=$(date +%s)
LIMIT=${LIMIT_S:-580}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
KEEP=/tmp/prism_s40_keep
for ex in $LONG; do
  L=$(left)
  [ $L -lt 150 ] && { echo "skip $ex: ${L}s left"; continue; }
  o=$OUT/ef_${ex}; lg=/tmp/ef_${ex}.log  # $OUT brings back 8 files: the JSON and the packed run only
  timeout $(( L - 15 )) python bench/emulate_fidelity.py --examples $ex --sizes long --device-path host --warmup-steps 2 --parallel 1 --slice-size 4 --calibration-repeats 3 ${MERGE:+--calibration-merge $MERGE} ${REPLAYERS:+--replayers $REPLAYERS} --repeats 3 --real-repeats 3 --budget-s $(( L - 25 )) --first-job-s 130 --keep $KEEP --out $o.json > $lg 2>&1
  echo "== $ex t=$(( $(date +%s)-T0 ))"; grep -E " r[0-9]+: |skipped|FAILED|Error" $lg
  python bench/_debug/fidelity_steps.py $o.json
  if [ "${ANALYZE:-1}" = 1 ]; then
    timeout 60 python bench/_debug/take_compute.py $KEEP/$ex-long
    for r in 2 5; do timeout 60 python bench/_debug/wait_kinds.py $KEEP/$ex-long $r; done
  fi
  tar -C $KEEP -cJf $OUT/keep_${ex}.tar.xz --exclude=payloads --exclude=capture --exclude=outputs --exclude='*.log' $ex-long
  ls -la $OUT/keep_${ex}.tar.xz
  rm -rf $KEEP/$ex-long
done
for ex in $SHORT; do
  L=$(left)
  [ $L -lt 80 ] && { echo "skip $ex: ${L}s left"; continue; }
  o=$OUT/ef_${ex}_short; lg=/tmp/ef_${ex}_short.log
  timeout $(( L - 10 )) python bench/emulate_fidelity.py --examples $ex --sizes default --device-path host --parallel 1 --slice-size 4 --calibration-repeats ${SHORT_TAKES:-1} ${MERGE:+--calibration-merge $MERGE} ${REPLAYERS:+--replayers $REPLAYERS} --repeats 2 --real-repeats 2 --budget-s $(( L - 20 )) --first-job-s 60 --keep $KEEP --out $o.json > $lg 2>&1
  echo "== $ex short t=$(( $(date +%s)-T0 ))"; grep -E " r[0-9]+: |skipped|FAILED|Error" $lg
  python bench/_debug/fidelity_steps.py $o.json
  for d in $KEEP/$ex-*; do tar -C $KEEP -cJf $OUT/keep_${ex}_short.tar.xz --exclude=payloads --exclude=capture --exclude=outputs --exclude='*.log' $(basename $d); rm -rf $d; done
done
