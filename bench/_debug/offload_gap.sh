#!/bin/bash
# Session 23's open question (docs/STATUS.md, Next 1): on 16 cores the emulated sandbox rank of the
# activation-offload what-if computes its forward + backward ~10 % slower than the real rank; on 2
# cores it does not. One device call: the ddp_cfg_sleep job at 60 steps recorded and calibrated
# unchanged, then rank 1 with DDP_OFFLOAD_ACTIVATIONS=1 emulated under each probe of
# bench/_debug/gil_probe beside real runs of the offload job, step medians and per-thread CPU.
#   PYTHONPATH=$PWD bash bench/_debug/offload_gap.sh /tmp/og [$OUT]
W=${1:-/tmp/og}; OUT=${2:-$W}; SUBDIR=threads
source "$(dirname "$0")/offload_setup.sh"
threads() { python3 - "$W/threads" <<'PY'
import collections, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("threads-*.txt")):
    head, *rows = f.read_text().splitlines()
    by = collections.Counter()
    for row in rows:
        name, _tid, cpu = row.rsplit(" ", 2)
        by[name] += float(cpu)
    print("   ", head[:90], "|", ", ".join(f"{k} {v:.2f}s" for k, v in by.most_common(6)))
    f.unlink()
PY
}
for i in 1 2; do
    PYTHONPATH=$ROOT/bench/_debug/gil_probe:$ROOT PROBE_THREADS=$W/threads prism record --job "$W/job_off.yaml" \
        --out "$W/off$i" --no-memory-pass > /dev/null 2>&1
    echo "real offload #$i: p50 ms per rank $(real_p50 "$W/off$i")"; threads
    for probe in none PROBE_PRELOAD_OFF=1 PROBE_SWITCH_INTERVAL=0.0005; do
        env PYTHONPATH=$ROOT/bench/_debug/gil_probe:$ROOT PROBE_THREADS=$W/threads $([ $probe = none ] || echo $probe) \
            python3 -c "import sys; from prism.cli.main import main; sys.argv[0] = 'prism'; sys.exit(main())" \
            emulate "$W/run" --ranks 1 --no-memory-pass --env DDP_OFFLOAD_ACTIVATIONS=1 --json > "$W/e.json" 2> "$W/e.err"
        python3 -c "
import json, sys; d = json.load(open(sys.argv[1])); print(f'emulated offload #{sys.argv[2]} ({sys.argv[3]}): p50 {d[\"ranks\"][\"1\"][\"p50_ms\"]:.1f} ms')" \
            "$W/e.json" "$i" "$probe" || tail -5 "$W/e.err"
        threads
    done
done 2>&1 | tee "$OUT/offload_gap.txt"
