#!/bin/bash
# Prism's per-collective cost on the script's thread (train.py): plain and under `prism record`,
# alternated REPEATS times per kind; one line per kind and OUT/op_cost.json. Usage: bash bench/_debug/op_cost_w1/run.sh OUT [W] [REPEATS]
set -e
OUT=${1:?out dir}; W=${2:-1}; REPEATS=${3:-3}
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../../.." && pwd); cd "$ROOT"
export PYTHONPATH=$ROOT${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}
mkdir -p "$OUT"
summary() {  # one line and one JSON entry per kind, at once: a call cut short keeps what it measured
  python - "$OUT" "$1" "$W" <<'P'
import glob, json, os, statistics, sys
out, kind, world = sys.argv[1], sys.argv[2], int(sys.argv[3])
row = {side: [round(json.load(open(f))["us_per_op"], 1) for f in sorted(glob.glob(f"{out}/{side}-{kind}-*.json"))]
       for side in ("plain", "record")}
med = {s: statistics.median(v) for s, v in row.items() if v}
path = f"{out}/op_cost.json"
data = json.load(open(path)) if os.path.exists(path) else {"world_size": world, "host_cpus": os.cpu_count(), "kinds": {}}
data["kinds"][kind] = {s: {"us_per_op": v, "median": med.get(s)} for s, v in row.items()}
json.dump(data, open(path, "w"), indent=1)
print(f"{kind:7s} us/op  plain {med.get('plain', 0):7.1f} {row['plain']}  record {med.get('record', 0):7.1f} {row['record']}",
      flush=True)
for f in glob.glob(f"{out}/*-{kind}-*.json") + glob.glob(f"{out}/*-{kind}-*.log") + [f"{out}/job-{kind}.yaml"]:
    os.remove(f)
P
}
for kind in c10d funcol; do
  for r in $(seq "$REPEATS"); do
    OP_COST_OUT=$OUT/plain-$kind-$r.json python - <<P
import sys; sys.path.insert(0, "bench")
from pathlib import Path
from _plain_launch import launch_plain
launch_plain(Path("$HERE/train.py"), ["--kind", "$kind"], $W)
P
    cat > "$OUT/job-$kind.yaml" <<Y
name: op_cost_$kind
entrypoint: $HERE/train.py
args: ["--kind", "$kind"]
world_size: $W
ranks_per_node: $W
device: cpu
slots: $W
Y
    OP_COST_OUT=$OUT/record-$kind-$r.json python -m prism.cli.main record --job "$OUT/job-$kind.yaml" \
        --out "$OUT/run-$kind-$r" ${RECORD_ARGS:-} > "$OUT/record-$kind-$r.log" 2>&1
    rm -rf "$OUT/run-$kind-$r"
  done
  summary "$kind"
done
