#!/usr/bin/env bash
# Every GPU check of the open issues, in one device call (the GPU machine has torch 2.11+cu130,
# grpcio, protobuf, safetensors, rich, pyyaml; prism runs from the checkout via PYTHONPATH).
#   bash bench/gpu_checks.sh OUTDIR
set -u
out=${1:-/tmp/prism-gpu}
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count())'
cuda_job() {  # $1 example, $2 extra yaml lines -> examples/$1/job-gpu.yaml
  sed -e 's/^device: cpu/device: cuda/' -e 's/"--steps"/"--device", "cuda", "--backend", "gloo", "--steps"/' \
      examples/$1/job.yaml > examples/$1/job-gpu.yaml
  printf '%s\n' "$2" >> examples/$1/job-gpu.yaml
}

echo "== 1. shim on CUDA: real runs of W=8 ranks sharing the GPU through gloo"
cuda_job hybrid 'values: {ranks: "2,5"}'
timeout 400 python3 -m prism.cli.main record --cuda-backend gloo --job examples/hybrid/job-gpu.yaml --out "$out/hybrid" > "$out/1-record.txt" 2>&1
echo "rc=$?"; tail -14 "$out/1-record.txt"

echo "== 2. collect: W=8 on one GPU with K=2 slots, cuda-checkpoint swaps"
[ -n "${SKIP_SWAP:-}" ] || timeout 500 python3 bench/gpu_collect_swap.py --gib-per-rank 2 --budget-gib 10 --steps 2 --samples "$out/2-swap-samples.json" > "$out/2-swap.json" 2> "$out/2-swap.err"
[ -n "${SKIP_SWAP:-}" ] || { echo "rc=$?"; tail -c 3000 "$out/2-swap.json"; tail -5 "$out/2-swap.err"; }

echo "== 3. virtual ranks: collect hybrid on GPU (values.ranks 2,5), emulate ranks 2,5 on the GPU"
timeout 500 python3 -m prism.cli.main collect --job examples/hybrid/job-gpu.yaml --out "$out/hybrid" > "$out/3-collect.txt" 2>&1
echo "collect rc=$?"; tail -4 "$out/3-collect.txt"
timeout 400 python3 -m prism.cli.main emulate "$out/hybrid" --ranks 2,5 --json > "$out/3-emulate.json" 2>&1
echo "emulate rc=$?"; tail -c 2500 "$out/3-emulate.json"
python3 - "$out/hybrid" <<'PY'
import json, sys, glob
from prism.graph.io import read_graph
run = sys.argv[1]
real = read_graph(f"{run}/graph/real")
bare = read_graph(f"{run}/graph/bare")
for r in (2, 5):
    print("rank", r, "real peak", real.summaries[r].peak_memory_bytes, real.summaries[r].memory_source,
          "| losses real", real.summaries[r].losses, "collected", bare.summaries[r].losses)
for f in sorted(glob.glob(f"{run}/emulations/*/report.json")):
    print(f, open(f).read()[:2000])
PY
rm -f examples/hybrid/job-gpu.yaml
