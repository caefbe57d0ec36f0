#!/bin/bash
# Session 37's device calls (16 cores): (1) the long-step examples still without a figure after
# 652dfca / c200b39 / 92dee53 (LONG, 3 real runs x 3 calibration takes x 3 emulations alternated),
# then (2) examples at their default (short) sizes (SHORT, 2 x 1 x 2), whose README row is still
# session 12's, each with the emulator's cost per comm op beside it, in what is left of the call.
# W=8, sandbox {2,5}, host path; jobs that would not end within the call are skipped (--budget-s)
# and the JSON is written after each job.
# Usage (device tool):
#   LONG="fsdp2-sleep pp-sleep" SHORT="ddp pp-1f1b moe tp" LIMIT_S=<limit> bash bench/_debug/device_s37.sh
#   LONG="" SHORT="pp-interleaved fsdp2 hybrid synthetic" LIMIT_S=<limit> bash bench/_debug/device_s37.sh
export PYTHONPATH=$PWD
T0=$(date +%s)
LIMIT=${LIMIT_S:-580}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
if [ -n "$LONG" ]; then
  L=$(left)
  timeout $(( L - 10 )) python bench/emulate_fidelity.py --examples $LONG --sizes long --device-path host --warmup-steps 2 --parallel 1 --slice-size 4 --calibration-repeats 3 --repeats 3 --real-repeats 3 --budget-s $(( ${LONG_BUDGET_S:-330} < L - 25 ? ${LONG_BUDGET_S:-330} : L - 25 )) --first-job-s 130 --out $OUT/ef_long.json > $OUT/ef_long.log 2>&1
  grep "host r\|skipped" $OUT/ef_long.log | grep -v compute; echo "t=$(( $(date +%s)-T0 ))"
  # every measured step of each real run and emulation (fsdp2-sleep's real runs spread by 6-8 %:
  # a few slow steps, or every step?)
  python - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/ef_long.json"))
for j in d["jobs"]:
    for r, v in j.get("ranks", {}).items():
        for k in ("real_runs_step_ms", "emulated_runs_step_ms"):
            for e in v.get(k, []):
                print(j["example"], r, k.split("_")[0], [round(x, 1) for x in e[1:]])
PY
fi
if [ -n "$SHORT" ]; then
  L=$(left)
  timeout $(( L - 5 )) python bench/emulate_fidelity.py --examples $SHORT --sizes default --device-path host --parallel 1 --slice-size 4 --calibration-repeats 1 --repeats 2 --real-repeats 2 --budget-s $(( L - 20 )) --first-job-s 100 --out $OUT/ef_short.json > $OUT/ef_short.log 2>&1
  grep "default r\|skipped" $OUT/ef_short.log | grep -v compute; echo "t=$(( $(date +%s)-T0 ))"
fi
