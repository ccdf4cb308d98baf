#!/bin/bash
# every 2-core case of docs/ps.md's "With the margin" table again, with C_i that add up to the median forward
cd /work/main
B=benchmarks/ibatch_testbed.py; J=docs/data/ps/medians
run() { name=$1; shift; echo "== $name $(date +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"; .venv/bin/python $B "$@" --json $J/$name.json 2>&1 | grep -v "^\s*$" ; sleep 30; }
R20="--model resnet20"
run resnet20_star2_500mbit_b16_send --topology star:2 --rate 500mbit $R20 --batch 16
run resnet20_star2_500mbit_b16_request --topology star:2 --rate 500mbit $R20 --batch 16 --pulls request
run resnet20_star3_s1_500mbit_b16_send --topology star:3 --servers 1 --rate 500mbit $R20 --batch 16
run resnet20_star3_s1_500mbit_b16_request --topology star:3 --servers 1 --rate 500mbit $R20 --batch 16 --pulls request
run googlenet_star2_250mbit_b2_send --topology star:2 --rate 250mbit --model googlenet --batch 2 --iters 6 --rounds 2
run googlenet_star2_250mbit_b2_request --topology star:2 --rate 250mbit --model googlenet --batch 2 --iters 6 --rounds 2 --pulls request
run resnet20_star2_100mbit_b32_send --topology star:2 $R20 --batch 32
run lenet5_star2_100mbit_b32_send --topology star:2 --model lenet5 --batch 32 --iters 6 --rounds 2
run resnet20_star3_s1_100mbit_b32_send --topology star:3 --servers 1 $R20 --batch 32
run resnet20_star3_s1_100mbit_b32_send_run2 --topology star:3 --servers 1 $R20 --batch 32
run resnet20_star4_s1_100mbit_b32_send --topology star:4 --servers 1 $R20 --batch 32
run lenet5_star4_s2_100mbit_b32_send --topology star:4 --servers 2 --model lenet5 --batch 32 --iters 6 --rounds 2
run resnet20_star3_50mbit_b32_send --topology star:3 --rate 50mbit --queue-ms 200 $R20 --batch 32
run resnet20_star3_500mbit_b16_request --topology star:3 --rate 500mbit $R20 --batch 16 --pulls request
run resnet20_star4_100mbit_b32_send --topology star:4 $R20 --batch 32
run resnet20_star4_20mbit_b32_send --topology star:4 --rate 20mbit --queue-ms 500 $R20 --batch 32 --iters 6 --rounds 2
run resnet20_star4_s1_100mbit_b32_send_run2 --topology star:4 --servers 1 $R20 --batch 32
run resnet20_star4_s1_100mbit_b32_send_run3 --topology star:4 --servers 1 $R20 --batch 32
echo "== done $(date +%H:%M:%S)"
