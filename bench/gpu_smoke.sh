#!/usr/bin/env bash
# The shim on the GPU machine's torch (2.11 + CUDA): walk and record examples, CPU and CUDA.
# Usage (device machine): bash bench/gpu_smoke.sh OUTDIR
set -u
out=${1:-/tmp/prism-gpu-smoke}
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -c 'import torch, grpc, google.protobuf as pb; print("torch", torch.__version__, "cuda", torch.cuda.device_count(), "grpc", grpc.__version__, "protobuf", pb.__version__)'
for ex in ddp tp fsdp2 pp hybrid; do
  timeout 300 python3 -m prism.cli.main record --job examples/$ex/job.yaml --out "$out/runs/$ex" > "$out/record-$ex.txt" 2>&1
  echo "record $ex rc=$?"; tail -3 "$out/record-$ex.txt"
  timeout 300 python3 -m prism.cli.main walk --job examples/$ex/job.yaml --rank 5 > "$out/walk-$ex.txt" 2>&1
  echo "walk $ex rc=$?"; tail -2 "$out/walk-$ex.txt"
done
python3 - "$out" <<'PY'
import sys
from prism.core.config import load_job
from prism.graph.io import read_graph
from prism.graph.compare import compare_comm_sequences
from prism.sandbox.launch import launch_ranks, LaunchOptions
out = sys.argv[1]
for ex in ["ddp", "tp", "fsdp2", "pp", "hybrid"]:
    try:
        job = load_job(f"examples/{ex}/job.yaml")
        g = read_graph(f"{out}/runs/{ex}/graph/real")
        recs = launch_ranks(job, LaunchOptions(engine="fake", max_parallel=8))
        bad = [str(d) for r in recs if (d := compare_comm_sequences(r.rank, g.nodes[r.rank], g.groups, r.nodes, {x.group_id: x for x in r.groups}))]
        print("fake-vs-record", ex, "OK" if not bad else bad[0])
    except Exception as e:
        print("fake-vs-record", ex, "ERROR", type(e).__name__, str(e)[:500])
PY
# CUDA: ranks share the one GPU through gloo with CUDA tensors.
for ex in ddp hybrid; do
  sed -e 's/^device: cpu/device: cuda/' -e 's/"--steps"/"--device", "cuda", "--backend", "gloo", "--steps"/' examples/$ex/job.yaml > examples/$ex/job-cuda.yaml
  timeout 300 python3 -m prism.cli.main record --cuda-backend gloo --job examples/$ex/job-cuda.yaml --out "$out/runs/$ex-cuda" > "$out/record-$ex-cuda.txt" 2>&1
  echo "record $ex cuda rc=$?"; tail -12 "$out/record-$ex-cuda.txt"
  rm -f examples/$ex/job-cuda.yaml
done
