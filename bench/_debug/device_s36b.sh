#!/bin/bash
# Session 36: pp-sleep's emulation and calibration came out +3.1 % (real 145.8 ms) after 652dfca,
# c200b39 and 92dee53, against +1.05 / -0.26 % (calibrated -0.02 / -0.11 %, real 152 ms) in session
# 34 on another machine. Both trees on this machine, alternated: the tree of session 34 (b8c74ed,
# copied to _base/, untracked) and this one; then hybrid-sleep and tp-sleep on this tree while the
# call's time lasts. Usage (device tool): LIMIT_S=<the call's limit> bash bench/_debug/device_s36b.sh
T0=$(date +%s)
ROOT=$PWD
LIMIT=${LIMIT_S:-560}
for t in new base; do
  d=$ROOT; [ $t = base ] && d=$ROOT/_base
  (cd $d && PYTHONPATH=$d timeout 150 python bench/emulate_fidelity.py --examples pp-sleep --sizes long --device-path host --warmup-steps 2 --parallel 1 --slice-size 4 --calibration-repeats 2 --repeats 2 --real-repeats 2 --out $OUT/ef_pp_$t.json > $OUT/ef_pp_$t.log 2>&1)
  grep "host r" $OUT/ef_pp_$t.log | grep -v compute | sed "s/^/$t /"; echo "t=$(( $(date +%s)-T0 ))"
done
LEFT=$(( LIMIT - $(date +%s) + T0 - 10 ))
PYTHONPATH=$ROOT timeout $LEFT python bench/emulate_fidelity.py --examples hybrid-sleep tp-sleep --sizes long --device-path host --warmup-steps 2 --parallel 1 --slice-size 4 --calibration-repeats 3 --repeats 3 --real-repeats 3 --budget-s $(( LEFT - 15 )) --first-job-s 130 --out $OUT/ef_rest.json > $OUT/ef_rest.log 2>&1
grep "host r\|skipped" $OUT/ef_rest.log | grep -v compute; echo "t=$(( $(date +%s)-T0 ))"
