#!/bin/bash
# Session 36's device calls (16 cores): the whole long-step table after 652dfca (ring endpoints send
# by chunk), c200b39 (only the first step is paced; a second warm-up step plays timed) and 92dee53
# (one by-dependency driver for vrank endpoints), none of which has a 16-core figure yet.
# 3 real runs x 3 calibration takes x 3 emulations alternated, W=8, sandbox {2,5}; jobs that would
# not end within the call are skipped (--budget-s) and the JSON is written after each job, so a cut
# call keeps what it measured. Then every rank's per-step times (the later pipeline stage's first
# measured step was 99-100 ms against 110 real before c200b39).
# Usage (device tool), two calls of 4 examples (~125 s each):
#   EXAMPLES="pp-sleep synthetic moe-sleep pp-interleaved-sleep" LIMIT_S=<limit> bash bench/_debug/device_s36.sh
#   EXAMPLES="hybrid-sleep tp-sleep ddp-sleep fsdp2-sleep" LIMIT_S=<limit> bash bench/_debug/device_s36.sh
export PYTHONPATH=$PWD
T0=$(date +%s)
LIMIT=${LIMIT_S:-580}
timeout $(( LIMIT - 10 )) python bench/emulate_fidelity.py --examples ${EXAMPLES:-pp-sleep synthetic moe-sleep} --sizes long --device-path host --warmup-steps 2 --parallel 1 --slice-size 4 --calibration-repeats 3 --repeats 3 --real-repeats 3 --budget-s $(( LIMIT - 25 )) --first-job-s 130 --out $OUT/ef.json > $OUT/ef.log 2>&1
grep "host r\|skipped" $OUT/ef.log | grep -v compute; echo "t=$(( $(date +%s)-T0 ))"
python - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/ef.json"))
for j in d["jobs"]:
    for r, v in j.get("ranks", {}).items():
        print(j["example"], r, "real", [round(x, 1) for x in v["real_step_ms"][1:]])
        for e in v["emulated_runs_step_ms"]:
            print("    emu", [round(x, 1) for x in e[1:]])
PY
