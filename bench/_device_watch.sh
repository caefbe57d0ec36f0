#!/usr/bin/env bash
# Run a command on the device machine under a deadline; on the deadline, print every Python
# process's stacks into its own log (bench/_debug/sitecustomize.py registers SIGUSR1), record the
# process tree and the GPUs, stop the command's process group, and copy the tails of the logs
# under LOG_DIR into $OUT/<tag>/. Usage: bench/_device_watch.sh TAG DEADLINE_S LOG_DIR -- command...
set -u
descendants() { local c; for c in $(ps -o pid= --ppid "$1"); do echo "$c"; descendants "$c"; done; }
tag=$1; deadline=$2; logdir=$3; shift 4
mkdir -p "$OUT/$tag"
setsid "$@" > "$OUT/$tag/cmd.log" 2>&1 &
pid=$!
t0=$(date +%s)
while kill -0 $pid 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt "$deadline" ]; do sleep 2; done
if kill -0 $pid 2>/dev/null; then
  {
    echo "deadline ${deadline}s reached; still running:"
    ps -eo pid,ppid,pgid,etime,pcpu,rss,args --forest | grep -E "python" | grep -v grep | cut -c1-300
    nvidia-smi
  } > "$OUT/$tag/hung.txt" 2>&1
  for p in $pid $(descendants $pid); do kill -USR1 "$p" 2>/dev/null; done
  sleep 4
  kill -TERM -- -$pid 2>/dev/null; sleep 3; kill -KILL -- -$pid 2>/dev/null
fi
wait $pid; echo "exit $?" >> "$OUT/$tag/cmd.log"
find "$logdir" \( -name '*.log' -o -name '*.txt' -o -name 'report.json' \) -size -5M 2>/dev/null | while read -r f; do
  rel=${f#"$logdir"/}; mkdir -p "$OUT/$tag/logs/$(dirname "$rel")"; tail -c 30000 "$f" > "$OUT/$tag/logs/$rel"
done
tail -c 3000 "$OUT/$tag/cmd.log"
