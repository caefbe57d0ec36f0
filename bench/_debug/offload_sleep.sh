#!/bin/bash
# Session 24, after offload_gap.sh (the GIL probes changed nothing): where the emulated offload
# rank's extra ~8 ms per step goes, sleep by sleep. The ddp_cfg_sleep job at 60 steps recorded and
# calibrated unchanged; then real runs and emulations (rank 1) of the offload job and of the
# unchanged one with bench/_debug/gil_probe's PROBE_SLEEP: per process, the median oversleep of the
# job's sleeps and the median work between them (steps 5 onwards).
#   PYTHONPATH=$PWD bash bench/_debug/offload_sleep.sh /tmp/os [$OUT]
W=${1:-/tmp/os}; OUT=${2:-$W}; SUBDIR=sleep
source "$(dirname "$0")/offload_setup.sh"
sleeps() { python3 - "$W/sleep" "$1" <<'PY'
import json, pathlib, statistics, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("sleep-*.json")):
    d = json.loads(f.read_text()); calls = d["calls"]; f.unlink()
    calls = calls[len(calls) // 10:]  # past the first steps
    over = [took - asked for _s, asked, took in calls]
    gaps = [b[0] - (a[0] + a[2]) for a, b in zip(calls, calls[1:])]
    per_step = 7  # 4 forward sleeps, 3 backward
    print(f"    {sys.argv[2]}: {len(calls)} sleeps, oversleep p50 {statistics.median(over) * 1e6:.0f} us "
          f"p90 {sorted(over)[int(.9 * len(over))] * 1e6:.0f} us sum/step {sum(over) / len(calls) * per_step * 1e3:.2f} ms; "
          f"gap p50 {statistics.median(gaps) * 1e6:.0f} us, sum/step {sum(gaps) / len(calls) * per_step * 1e3:.2f} ms "
          f"| {d['argv'][:70]}")
PY
}
for i in 1 2; do
    for kind in off base; do
        job=$W/job.yaml; envs=(); [ $kind = off ] && { job=$W/job_off.yaml; envs=(--env DDP_OFFLOAD_ACTIVATIONS=1); }
        PYTHONPATH=$ROOT/bench/_debug/gil_probe:$ROOT PROBE_SLEEP=$W/sleep prism record --job "$job" \
            --out "$W/$kind$i" --no-memory-pass > /dev/null 2>&1
        echo "real $kind #$i: p50 ms per rank $(real_p50 "$W/$kind$i")"; sleeps real
        PYTHONPATH=$ROOT/bench/_debug/gil_probe:$ROOT PROBE_SLEEP=$W/sleep prism emulate "$W/run" --ranks 1 \
            --no-memory-pass "${envs[@]}" --json > "$W/e.json" 2> "$W/e.err"
        python3 -c "
import json, sys; d = json.load(open(sys.argv[1])); print(f'emulated {sys.argv[2]} #{sys.argv[3]}: p50 {d[\"ranks\"][\"1\"][\"p50_ms\"]:.1f} ms')" \
            "$W/e.json" "$kind" "$i" || tail -5 "$W/e.err"
        sleeps emulated
    done
done 2>&1 | tee "$OUT/offload_sleep.txt"
