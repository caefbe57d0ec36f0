#!/bin/bash
# Session 26, after offload_sleep.sh (16 cores: the emulated offload rank's work between its sleeps,
# not its wake-ups, was ~4-8 ms per step longer than the real rank's): the time of each saved-tensor
# pack and unpack hook (the host copies) and each garbage collection, real rank 1 vs emulated rank 1,
# alternated, with gil_probe's PROBE_PACK and PROBE_GC, and each process's page faults and context
# switches. With PACK_MALLOC=1 every process runs with glibc's mmap threshold at 256 MiB (no
# mmap/munmap per large host buffer: if the emulated rank's extra time goes with it, it was the
# unmapping's TLB shootdowns across the cores its other threads ran on). The ddp_cfg_sleep job at
# 30 steps, recorded and calibrated unchanged.
#   PYTHONPATH=$PWD bash bench/_debug/offload_pack.sh /tmp/op [$OUT] [repeats]
W=${1:-/tmp/op}; OUT=${2:-$W}; N=${3:-1}
SUBDIR=pack; STEPS=30
[ "${PACK_MALLOC:-0}" = 1 ] && export GLIBC_TUNABLES=glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=536870912
source "$(dirname "$0")/offload_setup.sh"
packs() { python3 - "$W/pack" "$1" "$STEPS" <<'PY'
import json, pathlib, statistics, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("pack-*.json")):
    d = json.loads(f.read_text()); f.unlink()
    if not d["pack"]:
        continue
    steps = int(sys.argv[3]) - 2
    for what in ("pack", "unpack"):
        calls = d[what][len(d[what]) // 10:]
        big = [t for t, b in calls if b >= 1 << 20] or [0.0]
        print(f"    {sys.argv[2]} rank {d['rank']} {what}: {len(d[what])} calls, per step {sum(t for t, _ in calls) / (0.9 * steps) * 1e3:.2f} ms, "
              f">= 1 MiB p50 {statistics.median(big) * 1e6:.0f} us p90 {sorted(big)[int(.9 * len(big))] * 1e6:.0f} us")
    if "to" in d["usage"]:
        a, b = d["usage"]["from"], d["usage"]["to"]
        per = (b["packs"] - a["packs"]) / (len(d["pack"]) / int(sys.argv[3]))  # steps between the two readings
        u = {k: (b[k] - a[k]) / per for k in ("minflt", "nvcsw", "nivcsw", "utime", "stime")}
        print(f"    {sys.argv[2]} rank {d['rank']} per step: {u['minflt']:.0f} minor faults, {u['nvcsw']:.1f} voluntary / "
              f"{u['nivcsw']:.1f} involuntary switches, user {u['utime'] * 1e3:.2f} ms, system {u['stime'] * 1e3:.2f} ms "
              f"({b['threads']} Python threads)")
        for when in ("from", "to"):
            m = d["usage"][when]["mallinfo"]
            print(f"    {sys.argv[2]} rank {d['rank']} heap at pack {d['usage'][when]['packs']}: {m['hblks']} mmapped chunks "
                  f"({m['hblkhd'] / 2**20:.1f} MiB), heap {m['arena'] / 2**20:.1f} MiB ({m['fordblks'] / 2**20:.1f} free)")
        if "heap_peaks" in d["usage"]:
            m = d["usage"]["heap_peaks"]
            print(f"    {sys.argv[2]} rank {d['rank']} heap, most seen at every 10th pack: {m['hblks']} mmapped chunks "
                  f"({m['hblkhd'] / 2**20:.1f} MiB), heap {m['arena'] / 2**20:.1f} MiB")
for f in sorted(pathlib.Path(sys.argv[1]).glob("gc-*.json")):
    d = json.loads(f.read_text()); f.unlink()
    by = {}
    for gen, took, _ in d["calls"]:
        by.setdefault(gen, []).append(took)
    print(f"    {sys.argv[2]} rank {d['rank']} gc: {d['tracked']} objects; " + "; ".join(
        f"gen{g} {len(v)}x {sum(v) * 1e3:.1f} ms (max {max(v) * 1e3:.1f})" for g, v in sorted(by.items()))
        + f" | {d['argv'][:50]}")
PY
}
for i in $(seq 1 "$N"); do
    PYTHONPATH=$ROOT/bench/_debug/gil_probe:$ROOT PROBE_PACK=$W/pack PROBE_GC=$W/pack prism record --job "$W/job_off.yaml" \
        --out "$W/off$i" --no-memory-pass > /dev/null 2>&1
    sleep 1.5; echo "real off #$i: p50 ms per rank $(real_p50 "$W/off$i")"; packs real
    PYTHONPATH=$ROOT/bench/_debug/gil_probe:$ROOT PROBE_PACK=$W/pack PROBE_GC=$W/pack prism emulate "$W/run" --ranks 1 \
        --no-memory-pass --env DDP_OFFLOAD_ACTIVATIONS=1 --json > "$W/e.json" 2> "$W/e.err"
    sleep 1.5; python3 -c "
import json, sys; d = json.load(open(sys.argv[1])); print(f'emulated off #{sys.argv[2]}: p50 {d[\"ranks\"][\"1\"][\"p50_ms\"]:.1f} ms')" \
        "$W/e.json" "$i" || tail -5 "$W/e.err"
    packs emulated
done 2>&1 | tee "$OUT/offload_pack${PACK_MALLOC:+_malloc$PACK_MALLOC}.txt"
