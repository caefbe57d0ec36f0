#!/bin/bash
# Next session's device call (16 cores), after d412fc9 (calibration slices complete each op when
# the backend finished it; each node takes its median over a slice's takes): the three pipelines
# whose calibration the late-wait stamps inflated or the shortest take biased, 3 real runs,
# 3 calibration takes and 3 emulations alternated, JSON after each job; then moe-sleep's
# recorder cost with each side's CPU split by thread and the op publisher off as a third side.
# Usage (device tool): LIMIT_S=<the call's limit> bash bench/_debug/device_s34.sh
#   (EXAMPLES="hybrid-sleep moe-sleep tp-sleep" for a second call; ~170 s per example)
export PYTHONPATH=$PWD
T0=$(date +%s)
LEFT=$(( ${LIMIT_S:-580} - 130 ))
timeout $LEFT python bench/emulate_fidelity.py --examples ${EXAMPLES:-pp-interleaved-sleep pp-sleep} --sizes long --device-path host --warmup-steps 2 --parallel 1 --slice-size 4 --calibration-repeats 3 --repeats 3 --real-repeats 3 --out $OUT/ef.json > $OUT/ef.log 2>&1
grep -v "^\s*$" $OUT/ef.log | tail -24; echo "t=$(( $(date +%s)-T0 ))"
LEFT=$(( ${LIMIT_S:-580} - $(date +%s) + T0 - 10 ))
echo "moe record overhead: ${LEFT} s left"
timeout $LEFT python bench/record_overhead.py --examples moe-sleep --repeats 2 --threads --record-env PRISM_OPWATCH=0 --label s34 --out $OUT/ro_moe.json > $OUT/ro_moe.log 2>&1
grep -v "^\s*$" $OUT/ro_moe.log | tail -12; echo "t=$(( $(date +%s)-T0 ))"
