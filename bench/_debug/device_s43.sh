#!/bin/bash
# Session 43 (16 cores): where a 2-rank all-reduce with a vrank partner spends its time (tp-sleep:
# 1.2-1.4 ms after the later issue emulated, 0.4-0.6 in the real runs and the takes), on copies of
# the tree patched with the hop probe (bench/_debug/hop_probe/apply.py). Per job in JOBS: one
# `prism record` and one `prism calibrate --repeats 3`, then ROUNDS rounds of alternated emulations
# (W=8, sandbox {2,5}, host path), one per variant in VARIANTS:
#   r1   one replayer (the default);
#   rN   N replayers (tp's and hybrid's two TP groups in separate processes from N=4);
#   sw   one replayer, the sandbox ranks' GIL switch interval 200 us instead of 5 ms (the script's
#        thread runs Python between its issue and its wait while the op's channel thread waits for
#        the GIL; a sed-patched copy of prism/sandbox/worker.py);
#   early one replayer, PRISM_LIVE_EARLY_START=1 (a small collective's first ring step posted on the
#        script's thread at its issue);
#   rsw  one replayer whose GIL switch interval is 50 us instead of 200 (the vrank's receive is
#        noticed 220-340 us after the sandbox posted it: the replayer's other TP channel may hold the GIL).
# Each: step time against its prediction, the replayers' idle clock wake-ups, the hop medians of
# both TP groups (hops.py); then bench/_debug/pair_timing.py on the run (real run, takes, every
# emulation). The run directory without payloads is packed into $OUT.
# Usage (device tool):  JOBS="tp-sleep" VARIANTS="r1 early r4 sw rsw" ROUNDS=2 LIMIT_S=575 bash bench/_debug/device_s43.sh
ROOT=$PWD
T0=$(date +%s)
LIMIT=${LIMIT_S:-575}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
P=/tmp/probed
rm -rf $P $P-sw $P-rsw && mkdir -p $P && tar -C $ROOT --exclude=./.git --exclude=./bench/results --exclude=./_base -cf - . | tar -C $P -xf -
python bench/_debug/hop_probe/apply.py $P || exit 1
cp -r $P $P-sw && cp -r $P $P-rsw
sed -i 's/^_SWITCH_INTERVAL_S = 2e-4/_SWITCH_INTERVAL_S = 5e-5/' $P-rsw/prism/vrank_replayer/replayer.py
grep -n "^_SWITCH_INTERVAL_S" $P-rsw/prism/vrank_replayer/replayer.py
sed -i 's/^    os.environ.update(spec.env)$/    os.environ.update(spec.env)\n    sys.setswitchinterval(2e-4)/' $P-sw/prism/sandbox/worker.py
grep -q "^import sys" $P-sw/prism/sandbox/worker.py || sed -i '0,/^import /s//import sys\nimport /' $P-sw/prism/sandbox/worker.py
grep -n "setswitchinterval" $P-sw/prism/sandbox/worker.py
# From /tmp: `python -c` puts the working directory first on sys.path, and the checkout's prism/ would
# shadow the probed copy in PYTHONPATH (the workers import the launcher's prism).
prism() { (cd /tmp && PYTHONPATH=$1 python -c "import sys; from prism.cli.main import main; sys.exit(main())" "${@:2}"); }
declare -A YAML=([tp-sleep]=examples/tp/job-sleep.yaml [hybrid-sleep]=examples/hybrid/job-sleep.yaml)
declare -A TP=([tp-sleep]="4 5" [hybrid-sleep]="10 11")
for job in ${JOBS:-tp-sleep}; do
  L=$(left); [ $L -lt 120 ] && { echo "skip $job: ${L}s left"; continue; }
  R=/tmp/s43/$job; rm -rf $R; mkdir -p /tmp/s43
  prism $ROOT record --job $ROOT/${YAML[$job]} --out $R > /tmp/s43/$job.rec.log 2>&1 || { tail -20 /tmp/s43/$job.rec.log; continue; }
  prism $ROOT calibrate $R --slice-size 4 --repeats 3 > /tmp/s43/$job.cal.log 2>&1 || { tail -20 /tmp/s43/$job.cal.log; continue; }
  echo "== $job t=$(( $(date +%s)-T0 ))"; grep -E "iteration time" /tmp/s43/$job.cal.log
  for i in $(seq 1 ${ROUNDS:-2}); do
    for v in ${VARIANTS:-r1 early r4 sw rsw}; do
      L=$(left); [ $L -lt 40 ] && { echo "skip $job $v $i: ${L}s left"; continue; }
      tree=$P; n=1; early=0
      case $v in sw) tree=$P-sw ;; rsw) tree=$P-rsw ;; early) early=1 ;; r*) n=${v#r} ;; esac
      pd=$R/probe_${v}_$i; mkdir -p $pd
      PRISM_LIVE_EARLY_START=$early PRISM_PAIR_PROBE=$pd timeout $(( L - 10 )) bash -c "$(declare -f prism); prism $tree emulate $R --ranks 2,5 --device-path host --replayers $n --json" > $pd/report.json 2> $pd/err.log
      d=$(ls -td $R/emulations/* | head -1)
      python - "$pd/report.json" "$d" "$v $i" <<'PY'
import glob, json, sys
rep, d, name = sys.argv[1:]
r = json.load(open(rep))
w = [json.load(open(f)).get("clock_idle_wakeups") for f in sorted(glob.glob(f"{d}/replayer-[0-9][0-9][0-9].json"))]
print(name, d.rsplit("/", 1)[-1], {k: (round(v["mean_ms"], 2), round(v["predicted_mean_ms"], 2)) for k, v in r["ranks"].items()}, "idle wake-ups", w)
PY
      for g in ${TP[$job]}; do python bench/_debug/hop_probe/hops.py $pd $g | head -26; done
    done
  done
  for r in 2 5; do timeout 60 python bench/_debug/pair_timing.py $R $r --skip 1; done
  tar -C /tmp/s43 -cJf $OUT/keep_${job}_s43.tar.xz --exclude=payloads --exclude=capture --exclude=outputs --exclude='*.log' $job
done
