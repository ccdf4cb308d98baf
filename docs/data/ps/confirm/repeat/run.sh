#!/bin/bash
# two cases of ../run.sh run twice more each, right after it (same code): how far one case moves run to run
cd "${BENCH_TREE:-/work/main}"
B=benchmarks/ibatch_testbed.py; J=docs/data/ps/confirm/repeat
run() { name=$1; shift; echo "== $name $(date +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"; .venv/bin/python $B "$@" --json $J/$name.json 2>&1 | grep -v "^\s*$" ; sleep 30; }
for i in 2 3; do
  run resnet20_star2_500mbit_b16_send_run$i --topology star:2 --rate 500mbit --model resnet20 --batch 16
  run emulated_resnet20_star5_100mbit_send_run$i --topology star:5 --model emulated:resnet20-cpu-b32 --batch 32
done
echo "== done $(date +%H:%M:%S)"
