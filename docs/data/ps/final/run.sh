#!/bin/bash
# after docs/data/ps/medians: the dedicated-server cases with the 5% margin, and the cases with more
# processes than the 2-core VM's cores with a CPU quota per emulated server (testbed up --cpus)
cd /work/main
B=benchmarks/ibatch_testbed.py; J=docs/data/ps/final
run() { name=$1; shift; echo "== $name $(date +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"; .venv/bin/python $B "$@" --json $J/$name.json 2>&1 | grep -v "^\s*$" ; sleep 30; }
R20="--model resnet20"
run resnet20_star3_s1_100mbit_b32_send --topology star:3 --servers 1 $R20 --batch 32
run resnet20_star3_s1_100mbit_b32_send_run2 --topology star:3 --servers 1 $R20 --batch 32
run resnet20_star4_s1_100mbit_b32_send --topology star:4 --servers 1 $R20 --batch 32
run resnet20_star3_s1_500mbit_b16_request --topology star:3 --servers 1 --rate 500mbit $R20 --batch 16 --pulls request
run resnet20_star4_s1_100mbit_b32_send_cpus045 --topology star:4 --servers 1 $R20 --batch 32 --cpus 0.45
run resnet20_star3_50mbit_b32_send_cpus06 --topology star:3 --rate 50mbit --queue-ms 200 $R20 --batch 32 --cpus 0.6
run resnet20_star3_500mbit_b16_request_cpus06 --topology star:3 --rate 500mbit $R20 --batch 16 --pulls request --cpus 0.6
run resnet20_star4_100mbit_b32_send_cpus045 --topology star:4 $R20 --batch 32 --cpus 0.45
run resnet20_star4_20mbit_b32_send_cpus045 --topology star:4 --rate 20mbit --queue-ms 500 $R20 --batch 32 --iters 6 --rounds 2 --cpus 0.45
echo "== done $(date +%H:%M:%S)"
# then, appended while the above ran: the dedicated 500 Mbit/s send-mode case twice
run resnet20_star3_s1_500mbit_b16_send --topology star:3 --servers 1 --rate 500mbit $R20 --batch 16
run resnet20_star3_s1_500mbit_b16_send_run2 --topology star:3 --servers 1 --rate 500mbit $R20 --batch 16
echo "== done $(date +%H:%M:%S)"
# then: three co-located workers at 50 Mbit/s with one queue per destination at each server's NIC
run resnet20_star3_50mbit_b32_send_cpus06_fair --topology star:3 --rate 50mbit --queue-ms 200 $R20 --batch 32 --cpus 0.6 --host-queue fair
run resnet20_star3_50mbit_b32_send_fair --topology star:3 --rate 50mbit --queue-ms 200 $R20 --batch 32 --host-queue fair
echo "== done $(date +%H:%M:%S)"
