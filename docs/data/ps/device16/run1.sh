#!/bin/bash
# request mode and send mode at five and nine co-located workers, compute emulated, with a core per process
export PYTHONPATH=$PWD/src PATH=$PWD/.iproute/bin:$PATH
B=benchmarks/ibatch_testbed.py; E20="--model emulated:resnet20-cpu-b32 --batch 32"
nproc; python3 -c "import torch,sys; print(torch.__version__, sys.version.split()[0])"; uname -r
run() { name=$1; shift; echo "== $name $(date +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"; timeout 200 python3 $B "$@" --json $OUT/$name.json 2>&1 | grep -v "^\s*$" | cut -c1-250; }
run emulated_resnet20_star5_100mbit_request --topology star:5 $E20 --pulls request
run emulated_resnet20_star9_100mbit_request --topology star:9 $E20 --pulls request
run emulated_resnet20_star5_100mbit_send --topology star:5 $E20
run emulated_resnet20_star9_100mbit_send --topology star:9 $E20
echo "== done $(date +%H:%M:%S)"
