#!/bin/bash
# Session 34: a vrank endpoint of a ring sends each message once its chunk's earlier messages are in
# (prism/nccl_patches/pruned.py, _start_by_chunk), not step by step. The tree before it is copied
# to _base/ (untracked). Both trees, alternated: the op alone (W=8, 1 KiB all-reduce, sandbox {2,5}),
# then moe-sleep (its five small all-reduces per step ran 1.45 ms emulated against 1.07 calibrated).
# Usage (device tool): LIMIT_S=<the call's limit> bash bench/_debug/device_s34c.sh
T0=$(date +%s)
ROOT=$PWD
for t in new base; do
  d=$ROOT; [ $t = base ] && d=$ROOT/_base
  (cd $d && PYTHONPATH=$d timeout 60 python bench/op_overhead.py --world 8 --sizes 1024 --sandboxes "2,5" --ops all_reduce --iters-scale 5 --out $OUT/oo_$t.json 2>&1 | grep "B  real" | sed "s/^/$t /")
done
echo "t=$(( $(date +%s)-T0 ))"
for t in new base; do
  d=$ROOT; [ $t = base ] && d=$ROOT/_base
  LEFT=$(( ${LIMIT_S:-400} - $(date +%s) + T0 - 10 ))
  [ $t = new ] && LEFT=$(( LEFT / 2 ))
  (cd $d && PYTHONPATH=$d timeout $LEFT python bench/emulate_fidelity.py --examples moe-sleep --sizes long --device-path host --warmup-steps 2 --parallel 1 --slice-size 4 --calibration-repeats 2 --repeats 2 --real-repeats 2 --out $OUT/ef_moe_$t.json > $OUT/ef_moe_$t.log 2>&1)
  grep -v "^\s*$" $OUT/ef_moe_$t.log | grep "host r\|compute" | sed "s/^/$t /"; echo "t=$(( $(date +%s)-T0 ))"
done
