#!/bin/bash
# Session 39's device call (16 cores): 951e661 (a small send's divergence check off the script's wait)
# on the long-step examples in LONG at 3 x 3 x 3, W=8, sandbox {2,5}, host path, unpinned, run
# directories kept so that bench/_debug/wait_kinds.py and msg_timing.py can read each sandbox rank's waits
# (session 37: send waits 175-211 us emulated against 30-50 real on this host). Then, if OPS=1, the P2P
# cost per op (bench/op_overhead.py, W=4) as in session 38.
# REPLAYERS=N: replayer processes of each emulation.
# Usage (device tool):  LONG="pp-sleep pp-interleaved-sleep" OPS=0 LIMIT_S=<limit> bash bench/_debug/device_s39.sh
export PYTHONPATH=$PWD
T0=$(date +%s)
LIMIT=${LIMIT_S:-580}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
KEEP=/tmp/prism_s39_keep
for ex in $LONG; do
  L=$(left)
  [ $L -lt 150 ] && { echo "skip $ex: ${L}s left"; continue; }
  o=$OUT/ef_${ex}
  timeout $(( L - 15 )) python bench/emulate_fidelity.py --examples $ex --sizes long --device-path host --warmup-steps 2 --parallel 1 --slice-size 4 --calibration-repeats 3 --repeats 3 --real-repeats 3 --budget-s $(( L - 25 )) --first-job-s 130 --replayers ${REPLAYERS:-1} --keep $KEEP --out $o.json > $o.log 2>&1
  echo "== $ex t=$(( $(date +%s)-T0 ))"; grep "host r\|skipped" $o.log
  python bench/_debug/fidelity_steps.py $o.json
  for r in 2 5; do timeout 60 python bench/_debug/wait_kinds.py $KEEP/$ex-long $r; timeout 60 python bench/_debug/msg_timing.py $KEEP/$ex-long $r; done
  rm -rf $KEEP/$ex-long
done
if [ "${OPS:-0}" = 1 ] && [ $(left) -gt 90 ]; then
  timeout $(( $(left) - 10 )) python bench/op_overhead.py --world 4 --sizes 4096,65536 --sandboxes "1;1,2" --ops send_recv,isend_irecv --iters-scale 3 --out $OUT/op_overhead_p2p.json > $OUT/op_overhead.log 2>&1
  echo "== ops t=$(( $(date +%s)-T0 ))"; tail -15 $OUT/op_overhead.log
fi
