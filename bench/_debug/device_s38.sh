#!/bin/bash
# Session 38's device call (16 cores): is pp-sleep's +3 % compute in the slices and the emulation a
# host effect of fewer busy processes? (1) bench/_debug/span_probe.py: examples/pp's stage work with no
# prism, 2 / 4 / 8 processes, unpinned and pinned; (2) the long-step examples in LONG at 3 x 3 x 3,
# unpinned and with PRISM_CPU_AFFINITY=rank (real runs, slices and emulations alike), alternated per
# example; W=8, sandbox {2,5}, host path. Every measured step of each run is printed.
# Usage (device tool):  LONG="pp-sleep fsdp2-sleep" PINS="1 0" LIMIT_S=<limit> bash bench/_debug/device_s38.sh
export PYTHONPATH=$PWD
T0=$(date +%s)
LIMIT=${LIMIT_S:-580}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
if [ "${PROBE:-1}" = 1 ]; then
  timeout 150 python bench/_debug/span_probe.py --procs 2 4 8 --seconds 3 --rounds 2 --out $OUT/span_probe.json
  echo "t=$(( $(date +%s)-T0 ))"
fi
for ex in $LONG; do
  for pin in ${PINS:-1 0}; do
    L=$(left)
    [ $L -lt 140 ] && { echo "skip $ex pin=$pin: ${L}s left"; continue; }
    if [ $pin = 1 ]; then export PRISM_CPU_AFFINITY=rank; else unset PRISM_CPU_AFFINITY; fi
    o=$OUT/ef_${ex}_pin${pin}
    timeout $(( L - 10 )) python bench/emulate_fidelity.py --examples $ex --sizes long --device-path host --warmup-steps 2 --parallel 1 --slice-size 4 --calibration-repeats 3 --repeats 3 --real-repeats 3 --budget-s $(( L - 20 )) --first-job-s 130 --out $o.json > $o.log 2>&1
    echo "== $ex pin=$pin t=$(( $(date +%s)-T0 ))"; grep "host r\|skipped" $o.log
    python bench/_debug/fidelity_steps.py $o.json
  done
done
unset PRISM_CPU_AFFINITY
