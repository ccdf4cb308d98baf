#!/bin/bash
# The 19 cases of docs/ps.md's table, one after the other, 30 s apart (needs root: each builds a testbed).
# Run from anywhere: it works from the repository root. J= another folder keeps these files as they are.
cd "$(dirname "$0")/../../../.."
B=benchmarks/ibatch_testbed.py; J=${J:-docs/data/ps/push_after_pulls}
run() { name=$1; shift; echo "== $name $(date +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"; .venv/bin/python $B "$@" --json $J/$name.json 2>&1 | grep -v "^\s*$" ; sleep 30; }
R20="--model resnet20"; E20="--model emulated:resnet20-cpu-b32"
# real compute, more processes than cores: with and without a CPU quota per server
run resnet20_star3_50mbit_b32_send_cpus06 --topology star:3 --rate 50mbit --queue-ms 200 $R20 --batch 32 --cpus 0.6
run resnet20_star3_50mbit_b32_send --topology star:3 --rate 50mbit --queue-ms 200 $R20 --batch 32
run resnet20_star4_100mbit_b32_send_cpus045 --topology star:4 $R20 --batch 32 --cpus 0.45
run resnet20_star4_20mbit_b32_send_cpus045 --topology star:4 --rate 20mbit --queue-ms 500 $R20 --batch 32 --iters 6 --rounds 2 --cpus 0.45
run resnet20_star4_100mbit_b32_send --topology star:4 $R20 --batch 32
run resnet20_star3_500mbit_b16_request_cpus06 --topology star:3 --rate 500mbit $R20 --batch 16 --pulls request --cpus 0.6
# two workers, and dedicated servers (the rotated order changes which worker a server sends to first)
run resnet20_star2_500mbit_b16_send --topology star:2 --rate 500mbit $R20 --batch 16
run resnet20_star3_s1_100mbit_b32_send --topology star:3 --servers 1 $R20 --batch 32
run resnet20_star4_s1_100mbit_b32_send --topology star:4 --servers 1 $R20 --batch 32
run googlenet_star2_250mbit_b2_send --topology star:2 --rate 250mbit --model googlenet --batch 2 --iters 4 --rounds 2
# emulated compute (sleeps of the shipped traces), co-located at the issue's scale
run emulated_resnet20_star5_100mbit_send --topology star:5 $E20 --batch 32
run emulated_resnet20_star9_100mbit_send --topology star:9 $E20 --batch 32
run emulated_resnet20_star5_100mbit_request --topology star:5 $E20 --batch 32 --pulls request
run emulated_resnet20_star9_100mbit_request --topology star:9 $E20 --batch 32 --pulls request
run emulated_googlenet_star5_250mbit_send --topology star:5 --rate 250mbit --model emulated:googlenet-cpu-b8 --batch 8 --iters 4 --rounds 2
run emulated_googlenet_star5_250mbit_request --topology star:5 --rate 250mbit --model emulated:googlenet-cpu-b8 --batch 8 --iters 4 --rounds 2 --pulls request
# the large-layer case: LeNet-5 (98% of its 13 MB in one fully-connected layer), compute emulated
run emulated_lenet5_star5_100mbit_send --topology star:5 --model emulated:lenet5-cpu-b64 --batch 64 --iters 6 --rounds 2
# dedicated servers at the issue's scale, compute emulated: five workers and two servers (star:7)
run emulated_resnet20_star7_s2_100mbit_send --topology star:7 --servers 2 $E20 --batch 32
run emulated_googlenet_star7_s2_250mbit_send --topology star:7 --servers 2 --rate 250mbit --model emulated:googlenet-cpu-b8 --batch 8 --iters 4 --rounds 2
echo "== done $(date +%H:%M:%S)"
