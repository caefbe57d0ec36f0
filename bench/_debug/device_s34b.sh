#!/bin/bash
# Session 34, after the full 3x3x3 table: moe-sleep's emulation is +1.6 % over its own timed graph
# (the one example over 2 %): keep its run, read per kind of wait what the emulation adds, and
# bring the graphs back; then fsdp2-sleep with 5 real runs (its real runs spread +-6-8 % on 16 cores).
# Usage (device tool): LIMIT_S=<the call's limit> bash bench/_debug/device_s34b.sh
export PYTHONPATH=$PWD
T0=$(date +%s)
timeout 260 python bench/emulate_fidelity.py --examples moe-sleep --sizes long --device-path host --warmup-steps 2 --parallel 1 --slice-size 4 --calibration-repeats 3 --repeats 2 --real-repeats 2 --keep /tmp/k --out $OUT/ef_moe.json > $OUT/ef_moe.log 2>&1
grep -v "^\s*$" $OUT/ef_moe.log | tail -8; echo "t=$(( $(date +%s)-T0 ))"
R=/tmp/k/moe-sleep-long
for E in $R/emulations/*/; do
  python bench/_debug/step_anatomy.py --ranks 2,5 --skip 2 $R/graph/timed $E 2>&1 | tail -30
done > $OUT/anatomy_emu.txt
python bench/_debug/step_anatomy.py --ranks 2,5 --skip 2 $R/graph/real $R/graph/timed > $OUT/anatomy_timed.txt 2>&1
head -60 $OUT/anatomy_emu.txt
tar czf $OUT/moe_keep.tgz --exclude='*.log' -C /tmp/k moe-sleep-long 2>/dev/null; ls -la $OUT
LEFT=$(( ${LIMIT_S:-580} - $(date +%s) + T0 - 15 ))
echo "fsdp2: ${LEFT} s left"
timeout $LEFT python bench/emulate_fidelity.py --examples fsdp2-sleep --sizes long --device-path host --warmup-steps 2 --parallel 1 --slice-size 4 --calibration-repeats 1 --repeats 2 --real-repeats 5 --out $OUT/ef_fsdp2.json > $OUT/ef_fsdp2.log 2>&1
grep -v "^\s*$" $OUT/ef_fsdp2.log | tail -8; echo "t=$(( $(date +%s)-T0 ))"
