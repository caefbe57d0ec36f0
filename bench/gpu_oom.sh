#!/usr/bin/env bash
# The OOM case of issue 5 on one GPU (torch 2.11 + CUDA; prism from the checkout via PYTHONPATH):
# the pp example as an 8-stage 1F1B pipeline, 8 ranks sharing the GPU through gloo, scaled so each
# stage holds hundreds of MiB of activations per microbatch in flight (stage s holds 8 - s of them).
#   1. real run, no cap: every rank's peak cuda.max_memory_allocated
#   2. real run with --memory-cap halfway between the second and third highest peaks (on the GPU
#      the two highest, stages 0 and 1, lie closer than one 32 MiB allocation): those two OOM (exit 3,
#      RUN/failure.json: rank, step, requested bytes), no other rank does
#   3. capture (all ranks live) so that any sandbox set can be emulated
#   4. emulate the rank that ran out first alone, same cap: it OOMs at the same step (exit 3, report.json)
#   5. emulate the third rank with the cap and --profile: no OOM, its peak beside the real run's,
#      a torch.profiler trace with CUDA kernels in RUN/emulations/<id>/profile/rank<R>.json
#   bash bench/gpu_oom.sh OUTDIR
# Caps are per process (set_per_process_memory_fraction = cap / device memory): they bound what the
# caching allocator of one rank reserves, whatever the other ranks on the same GPU hold.
set -u
out=${1:-/tmp/prism-gpu-oom}
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count())'
job="$out/job-gpu.yaml"
cat > "$job" <<EOF
name: pp8-gpu
entrypoint: $PWD/examples/pp/train.py
args: ["--device", "cuda", "--backend", "gloo", "--steps", "2", "--pp", "8", "--microbatches", "8",
       "--microbatch-size", "4096", "--dim", "1024"]
world_size: 8
device: cuda
iterations: {warmup: 1, measured: 1}
parallelism: {pp: 8}
EOF

echo "== 1. real run, no cap"
timeout 500 python3 -m prism.cli.main record --cuda-backend gloo --job "$job" --out "$out/run" > "$out/1-record.txt" 2>&1
echo "rc=$?"; tail -14 "$out/1-record.txt"
read -r top below cap < <(python3 - "$out/run" <<'PY'
import sys
from prism.graph.io import read_graph
g = read_graph(f"{sys.argv[1]}/graph/real")
peaks = {r: s.peak_memory_bytes for r, s in g.summaries.items()}
print({r: (p, g.summaries[r].memory_source) for r, p in sorted(peaks.items())}, file=sys.stderr)
(top, _), (_, high), (below, low) = sorted(peaks.items(), key=lambda kv: -kv[1])[:3]
print(top, below, (high + low) // 2)
PY
)
echo "top rank $top, highest rank below the cap $below, cap $cap bytes"

echo "== 2. real run with --memory-cap $cap"
timeout 500 python3 -m prism.cli.main record --cuda-backend gloo --job "$job" --out "$out/capped" --memory-cap "$cap" > "$out/2-record-capped.txt" 2>&1
echo "rc=$? (3 = a rank ran out of memory)"; grep "ran out of memory" "$out/2-record-capped.txt"; cat "$out/capped/failure.json"
# The first rank to run out stops the run (the others are stopped before they reach their OOM):
# emulate that one.
top=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['rank'])" "$out/capped/failure.json")

echo "== 3. capture (all 8 ranks live, values of every op)"
timeout 500 python3 -c "
from prism.core.rundir import RunDir
from prism.vrank_replayer import capture_job
capture_job(RunDir('$out/run').load_job(), '$out/run', timeout_s=450)" > "$out/3-capture.txt" 2>&1
echo "rc=$?"; tail -5 "$out/3-capture.txt"

echo "== 4. emulate rank $top with the cap"
timeout 400 python3 -m prism.cli.main emulate "$out/run" --ranks "$top" --memory-cap "$cap" --json > "$out/4-emulate-top.json" 2> "$out/4-emulate-top.err"
echo "rc=$? (3 = OOM)"; tail -5 "$out/4-emulate-top.err"

echo "== 5. emulate rank $below with the cap and --profile"
timeout 400 python3 -m prism.cli.main emulate "$out/run" --ranks "$below" --memory-cap "$cap" --profile --json > "$out/5-emulate-below.json" 2> "$out/5-emulate-below.err"
echo "rc=$?"; tail -5 "$out/5-emulate-below.err"

python3 - "$out" "$top" "$below" <<'PY'
import glob, json, sys
from prism.graph.io import read_graph
out, top, below = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
real = read_graph(f"{out}/run/graph/real")
failure = json.load(open(f"{out}/capped/failure.json"))
print("real run OOMs:", [(o["rank"], o["step"], o["requested_bytes"], o["in_use_bytes"]) for o in failure["ooms"]])
for rank in (top, below):
    (rep,) = sorted(glob.glob(f"{out}/run/emulations/*-ranks-{rank}/report.json"))[-1:]
    row = json.load(open(rep))["ranks"][str(rank)]
    oom = row["oom"] and (row["oom"]["step"], row["oom"]["requested_bytes"], row["oom"]["in_use_bytes"])
    print(f"emulated rank {rank}: oom(step, requested, in use)={oom} peak={row.get('peak_memory_bytes')} "
          f"(real run, no cap: {real.summaries[rank].peak_memory_bytes}) steps={row.get('step_ms')}")
for f in glob.glob(f"{out}/run/emulations/*/profile/rank*.json"):
    ev = json.load(open(f))["traceEvents"]
    cats = {}
    for e in ev:
        cats[e.get("cat")] = cats.get(e.get("cat"), 0) + 1
    print(f, "events by category:", cats)
PY
