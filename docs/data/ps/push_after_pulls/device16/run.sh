#!/bin/bash
# request mode, 200 ms switch-port queue, a core per process: a server posts the receives of the next pushes
# only once it has answered every worker's pull (deferred), against posting them before it answers (early,
# DPCOMM_PUSH_EARLY=1, the code before), alternated
export PYTHONPATH=$PWD/src PATH=$PWD/.iproute/bin:$PATH
B=benchmarks/ibatch_testbed.py; E20="--model emulated:resnet20-cpu-b32 --batch 32"
nproc; python3 -c "import torch,sys; print(torch.__version__, sys.version.split()[0])"; uname -r
run() { name=$1; shift; echo "== $name $(date +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"; timeout 120 python3 $B "$@" --json $OUT/$name.json 2>&1 | grep -v "^\s*$" | cut -c1-250; }
S9="--topology star:9 $E20 --pulls request --queue-ms 200"
run star9_request_q200_deferred $S9
DPCOMM_PUSH_EARLY=1 run star9_request_q200_early $S9
run star9_request_q200_deferred_2 $S9
DPCOMM_PUSH_EARLY=1 run star9_request_q200_early_2 $S9
run star5_request_q200_deferred --topology star:5 $E20 --pulls request --queue-ms 200
echo "== done $(date +%H:%M:%S)"
