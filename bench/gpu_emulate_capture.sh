#!/usr/bin/env bash
# Emulate ranks 2,5 of the hybrid example on the GPU, recorded data derived from a capture run
# (no collect: a minute instead of several on one GPU); prints the real run's peak and losses beside
# the emulated ones; every rank's error and log copied flat into OUTDIR/flat.
#   bash bench/gpu_emulate_capture.sh OUTDIR
set -u
out=${1:-/tmp/prism-gpu-emu}
mkdir -p "$out/flat"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
sed -e 's/^device: cpu/device: cuda/' -e 's/"--steps"/"--device", "cuda", "--backend", "gloo", "--steps"/' \
    examples/hybrid/job.yaml > examples/hybrid/job-gpu.yaml
timeout 90 python3 -m prism.cli.main record --cuda-backend gloo --job examples/hybrid/job-gpu.yaml --out "$out/run" > "$out/record.txt" 2>&1
echo "record rc=$?"
timeout 90 python3 -c "
from prism.core.rundir import RunDir
from prism.vrank_replayer import capture_job
capture_job(RunDir('$out/run').load_job(), '$out/run', derive_for=(2, 5), timeout_s=85)" > "$out/capture.txt" 2>&1
echo "capture rc=$?"; tail -3 "$out/capture.txt"
PRISM_LOG_LEVEL=INFO timeout 85 python3 -m prism.cli.main emulate "$out/run" --ranks 2,5 --json > "$out/emulate.json" 2>&1
echo "emulate rc=$?"; tail -c 1200 "$out/emulate.json"
for f in $(find "$out/run/emulations" "$out/run/capture" -name '*.error' -o -name '*.log' 2>/dev/null); do
  cp "$f" "$out/flat/$(echo "${f#$out/run/}" | tr '/' '_')"
done
python3 - "$out/run" <<'PY'
import glob, json, sys
from prism.graph.io import read_graph
real = read_graph(f"{sys.argv[1]}/graph/real")
for f in sorted(glob.glob(f"{sys.argv[1]}/emulations/*/report.json")):
    rep = json.load(open(f))
    for r in (2, 5):
        row = rep["ranks"][str(r)]
        print("rank", r, "real peak", real.summaries[r].peak_memory_bytes, "losses", real.summaries[r].losses)
        print("   emulated", json.dumps(row)[:600])
PY
rm -f examples/hybrid/job-gpu.yaml
