#!/bin/bash
# request mode with a 200 ms switch-port queue (the earlier device runs' setting: no incast drops), a core per process
export PYTHONPATH=$PWD/src PATH=$PWD/.iproute/bin:$PATH
B=benchmarks/ibatch_testbed.py; E20="--model emulated:resnet20-cpu-b32 --batch 32"
run() { name=$1; shift; echo "== $name $(date +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"; timeout 330 python3 $B "$@" --json $OUT/$name.json 2>&1 | grep -v "^\s*$" | cut -c1-250; }
run emulated_resnet20_star9_100mbit_request_q200 --topology star:9 $E20 --pulls request --queue-ms 200
run emulated_resnet20_star5_100mbit_request_q200 --topology star:5 $E20 --pulls request --queue-ms 200
run emulated_googlenet_star5_250mbit_request --topology star:5 --rate 250mbit --model emulated:googlenet-cpu-b8 --batch 8 --iters 4 --rounds 2 --pulls request
echo "== done $(date +%H:%M:%S)"
