#!/bin/bash
# 2026-11-25 on the 2-core VM, one after the other (30 s apart), nothing else running.
# The first run is the code before C_i were scaled to add up to the median forward (commit 8a0e7de's
# parent plus --cpus); the other three are that commit (layer_medians). docs/ps.md, "The current code".
cd /work/main
B=benchmarks/ibatch_testbed.py; J=docs/data/ps/cpus
run() { name=$1; shift; echo "== $name $(date +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"; .venv/bin/python $B "$@" --json $J/$name.json 2>&1 | grep -v "^\s*$" ; sleep 30; }
R20="--model resnet20 --batch 32"
run resnet20_star4_100mbit_b32_send $R20 --topology star:4 --cpus 0.45  # before layer_medians; its console line says ..._cpus045
run resnet20_star4_100mbit_b32_send_sums $R20 --topology star:4
run resnet20_star4_100mbit_b32_send_sums_cpus045 $R20 --topology star:4 --cpus 0.45
run resnet20_star4_s1_100mbit_b32_send_sums $R20 --topology star:4 --servers 1
echo "== done $(date +%H:%M:%S)"
