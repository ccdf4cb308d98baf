#!/bin/bash
# request mode, 200 ms switch-port queue, a core per process, every process's GIL switch interval 0.5 ms
# (docs/data/ps/pull_start/before/switch_interval.patch, applied to this copy only)
git apply docs/data/ps/pull_start/before/switch_interval.patch || patch -p1 < docs/data/ps/pull_start/before/switch_interval.patch
export PYTHONPATH=$PWD/src PATH=$PWD/.iproute/bin:$PATH DPCOMM_SWITCH=0.0005
B=benchmarks/ibatch_testbed.py; E20="--model emulated:resnet20-cpu-b32 --batch 32"
run() { name=$1; shift; echo "== $name $(date +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"; timeout 100 python3 $B "$@" --json $OUT/$name.json 2>&1 | grep -v "^\s*$" | cut -c1-250; }
run emulated_resnet20_star9_100mbit_request_q200_sw0.0005 --topology star:9 $E20 --pulls request --queue-ms 200
run emulated_resnet20_star5_100mbit_request_q200_sw0.0005 --topology star:5 $E20 --pulls request --queue-ms 200
echo "== done $(date +%H:%M:%S)"
