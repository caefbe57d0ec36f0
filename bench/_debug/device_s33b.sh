#!/bin/bash
# Session 33's second device call (16 cores): the per-op cost at W=2 and W=8 with enough
# iterations (the session-30 figure, 1.39 ms against 0.21 at W=2, came from 5 iterations), then
# the examples that missed a target at >= 50 ms (pp-sleep, pp-interleaved-sleep, moe-sleep), 3 real
# runs, 3 calibration takes and 3 emulations alternated, with what the call has left.
# Usage (device tool): LIMIT_S=<the call's limit> bash bench/_debug/device_s33b.sh
export PYTHONPATH=$PWD
T0=$(date +%s)
timeout 120 python bench/op_overhead.py --world 2 --sizes 4096,16384,1048576 --sandboxes 1 --ops all_reduce --device-paths host,lanes --iters-scale 10 --label w2_s33 --out $OUT/oo_w2.json > $OUT/oo_w2.log 2>&1
tail -12 $OUT/oo_w2.log; echo "t=$(( $(date +%s)-T0 ))"
timeout 120 python bench/op_overhead.py --world 8 --sizes 16384 --sandboxes "2,5" --ops all_reduce,all_to_all --device-paths host,lanes --iters-scale 5 --label w8_s33 --out $OUT/oo_w8.json > $OUT/oo_w8.log 2>&1
tail -12 $OUT/oo_w8.log; echo "t=$(( $(date +%s)-T0 ))"
LEFT=$(( ${LIMIT_S:-580} - $(date +%s) + T0 - 10 ))
echo "examples: ${LEFT} s left"
timeout $LEFT python bench/emulate_fidelity.py --examples pp-sleep moe-sleep pp-interleaved-sleep --sizes long --device-path host --warmup-steps 2 --parallel 1 --slice-size 4 --calibration-repeats 3 --repeats 3 --real-repeats 3 --out $OUT/ef_3.json > $OUT/ef_3.log 2>&1
grep -v "^\s*$" $OUT/ef_3.log | tail -24; echo "t=$(( $(date +%s)-T0 ))"
