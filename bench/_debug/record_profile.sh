#!/bin/bash
# The recorder's cost on the script's main thread, tp-sleep W=4: a plain launch and `prism record`
# of the same job, each rank's main thread profiled (cProfile, wall clock) from its 3rd step on and
# its garbage collections logged (main_probe/sitecustomize.py); then profile_diff.py and gc_steps.py.
# Usage: bash bench/_debug/record_profile.sh OUT   (STEPS=40 by default)
set -e
OUT=${1:?out dir}; ROOT=$(cd "$(dirname "$0")/../.." && pwd); cd "$ROOT"
export PYTHONPATH=$ROOT:$ROOT/bench/_debug/main_probe
STEPS=${STEPS:-40}
ARGS='"--steps", "'$STEPS'", "--tp", "2", "--sleep-ms", "20"'
mkdir -p "$OUT"
cat > "$OUT/tp.yaml" <<Y
name: tp
entrypoint: $ROOT/examples/tp/train.py
args: [$ARGS]
env: {}
world_size: 4
ranks_per_node: 4
device: cpu
iterations: {warmup: 1, measured: 3}
parallelism: {dp: 2, tp: 2, pp: 1, ep: 1, cp: 1}
slots: 4
Y
PRISM_GC_OUT=$OUT/gc_plain PRISM_STEP_PROFILE=$OUT/prof_plain python - <<P
import sys; sys.path.insert(0, "bench")
from pathlib import Path
from _plain_launch import launch_plain
launch_plain(Path("$ROOT/examples/tp/train.py"), [$ARGS], 4)
P
PRISM_GC_OUT=$OUT/gc_rec PRISM_STEP_PROFILE=$OUT/prof_rec python -m prism.cli.main record --job "$OUT/tp.yaml" \
    --out "$OUT/run" > "$OUT/record.log" 2>&1
rm -rf "$OUT/run"
python bench/_debug/gc_steps.py "$OUT"
python bench/_debug/profile_diff.py "$OUT"
