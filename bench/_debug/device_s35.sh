#!/bin/bash
# Next session's device calls (16 cores), after 652dfca (ring endpoints send by chunk), c200b39
# (only the first step is paced; a second warm-up step plays timed) and 92dee53 (session 35: one
# by-dependency driver for vrank endpoints of every algorithm and all-to-alls, receives posted ahead
# within 64 MiB): the whole table again, 3 real
# runs x 3 calibration takes x 3 emulations alternated, then every rank's per-step times (the
# later pipeline stage's first measured step was 99-100 ms against 110 real before c200b39).
# Usage (device tool), three calls of ~3 examples each (~110-170 s per example):
#   EXAMPLES="pp-sleep synthetic moe-sleep" LIMIT_S=<limit> bash bench/_debug/device_s35.sh
#   EXAMPLES="pp-interleaved-sleep hybrid-sleep tp-sleep" ...;  EXAMPLES="ddp-sleep fsdp2-sleep" ...
export PYTHONPATH=$PWD
T0=$(date +%s)
timeout $(( ${LIMIT_S:-580} - 15 )) python bench/emulate_fidelity.py --examples ${EXAMPLES:-pp-sleep synthetic moe-sleep} --sizes long --device-path host --warmup-steps 2 --parallel 1 --slice-size 4 --calibration-repeats 3 --repeats 3 --real-repeats 3 --out $OUT/ef.json > $OUT/ef.log 2>&1
grep "host r" $OUT/ef.log | grep -v compute; echo "t=$(( $(date +%s)-T0 ))"
python - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/ef.json"))
for j in d["jobs"]:
    for r, v in j["ranks"].items():
        print(j["example"], r, "real", [round(x, 1) for x in v["real_step_ms"][1:]])
        for e in v["emulated_runs_step_ms"]:
            print("    emu", [round(x, 1) for x in e[1:]])
PY
