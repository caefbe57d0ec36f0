#!/bin/bash
# Session 33's device call (16 cores): hybrid-sleep with 3 real runs, 3 calibration takes and
# 3 emulations in one call (does the slices' compute follow the real runs' within a call?), then
# the recorder's cost on every sleep example with what the call has left (JSON after every repeat).
# Usage (device tool): LIMIT_S=<the call's limit> bash bench/_debug/device_s33.sh
export PYTHONPATH=$PWD
T0=$(date +%s)
timeout 240 python bench/emulate_fidelity.py --examples hybrid-sleep --sizes long --device-path host --warmup-steps 2 --parallel 1 --slice-size 4 --calibration-repeats 3 --repeats 3 --real-repeats 3 --keep /tmp/k --out $OUT/ef_hy.json > $OUT/ef_hy.log 2>&1
tail -8 $OUT/ef_hy.log
for r in 2 5; do python bench/_debug/compute_spans.py --rank $r --skip 2 /tmp/k/hybrid-sleep-long/graph/real /tmp/k/hybrid-sleep-long/graph/timed --top 6; done > $OUT/spans.txt 2>&1
grep -iE "rank|per step|blocked" $OUT/spans.txt | head -30; echo "t=$(( $(date +%s)-T0 ))"
LEFT=$(( ${LIMIT_S:-580} - $(date +%s) + T0 - 10 ))
echo "record overhead: ${LEFT} s left"
timeout $LEFT python bench/record_overhead.py --examples tp-sleep hybrid-sleep fsdp2-sleep ddp-sleep moe-sleep pp-sleep --repeats 2 --label s33 --out $OUT/ro_all.json > $OUT/ro_all.log 2>&1
grep -v "^\s*$" $OUT/ro_all.log | tail -20; echo "t=$(( $(date +%s)-T0 ))"
