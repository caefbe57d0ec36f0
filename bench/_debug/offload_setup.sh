# Sourced by offload_gap.sh, offload_sleep.sh and offload_pack.sh (W, OUT and SUBDIR set by the
# caller, STEPS optional): the ddp_cfg_sleep job at STEPS steps (default 60; job.yaml) and with
# activation offload (job_off.yaml), recorded and calibrated unchanged into $W/run; prism() and
# real_p50 RUN (p50 of steps 2+ per rank).
set -u
STEPS=${STEPS:-60}
rm -rf "$W"; mkdir -p "$W/$SUBDIR" "$OUT"
ROOT=$PWD
prism() { python3 -c "import sys; from prism.cli.main import main; sys.argv[0] = 'prism'; sys.exit(main())" "$@"; }
sed -e "s#\.\./\.\./\.\./\.\./examples#$ROOT/examples#" -e "s/\"--steps\", \"8\"/\"--steps\", \"$STEPS\"/" \
    -e "s/measured: 6/measured: $((STEPS - 2))/" tests/assets/jobs/ddp_cfg_sleep/job.yaml > "$W/job.yaml"
sed 's/env: {}/env: {DDP_OFFLOAD_ACTIVATIONS: "1"}/' "$W/job.yaml" > "$W/job_off.yaml"
prism record --job "$W/job.yaml" --out "$W/run" > "$W/record.log" 2>&1 && prism calibrate "$W/run" > "$W/cal.log" 2>&1 \
    || { tail -20 "$W/record.log" "$W/cal.log"; exit 1; }
real_p50() { python3 -c "
import statistics, sys; from prism.graph.io import read_graph
g = read_graph(sys.argv[1] + '/graph/real')
print(' '.join(f'{statistics.median(s.step_times_ns[2:]) / 1e6:.1f}' for r, s in sorted(g.summaries.items())))" "$1"; }
