#!/bin/bash
# STATUS Next 1, 2 and 4 in one device call (~400 s on the 16-core machine, plus its start-up):
# the W=2 host-path op under the process-wide profile, tp's record overhead (profiles and the op
# publisher's A/B), hybrid's calibrated compute per span. Writes 8 files to $OUT (the per-call
# limit), prints their summaries. Parts run in order of need (record overhead, hybrid spans, the
# op profile, the main-thread profiles): a call cut short by the budget keeps the first.
# Usage (device tool): bash bench/_debug/device_next.sh
export PYTHONPATH=$PWD
set -x
T0=$(date +%s)
timeout 150 python bench/record_overhead.py --examples tp-sleep --repeats 2 --threads --record-env PRISM_OPWATCH=0 --out $OUT/ro.json > $OUT/ro.log 2>&1
tail -12 $OUT/ro.log; echo "t=$(( $(date +%s)-T0 ))"
timeout 170 python bench/emulate_fidelity.py --examples hybrid-sleep --sizes long --device-path host --warmup-steps 2 --parallel 1 --slice-size 4 --calibration-repeats 1 --repeats 1 --real-repeats 1 --keep /tmp/k --out $OUT/ef_hy.json > $OUT/ef_hy.log 2>&1
tail -8 $OUT/ef_hy.log
ls /tmp/k /tmp/k/* | head -20
for d in /tmp/k/*/graph; do python bench/_debug/compute_spans.py --rank 2 --skip 2 $d/real $d/timed --top 25; done > $OUT/spans.txt 2>&1
head -40 $OUT/spans.txt; echo "t=$(( $(date +%s)-T0 ))"
PRISM_CPROFILE_DIR=/tmp/prof timeout 110 python bench/op_overhead.py --world 2 --sizes 16384 --sandboxes 1 --ops all_reduce --device-paths host --out $OUT/oo.json > $OUT/oo.txt 2>&1
ls -la /tmp/prof >> $OUT/oo.txt
python bench/_debug/prof_top.py 30 /tmp/prof/*.prof >> $OUT/oo.txt 2>&1
grep -m3 -A12 'profiled' $OUT/oo.txt; echo "t=$(( $(date +%s)-T0 ))"
STEPS=40 timeout 120 bash bench/_debug/record_profile.sh /tmp/rp > $OUT/rp.txt 2>&1
tail -3 $OUT/rp.txt; echo "t=$(( $(date +%s)-T0 ))"
