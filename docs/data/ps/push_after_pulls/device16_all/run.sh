#!/bin/bash
# the co-located cases at five and nine workers after "request mode holds the next pushes", a core per
# process, every case with a 200 ms switch-port queue (no incast drops; the earlier 16-core request runs')
export PYTHONPATH=$PWD/src PATH=$PWD/.iproute/bin:$PATH
B=benchmarks/ibatch_testbed.py; E20="--model emulated:resnet20-cpu-b32 --batch 32"; Q="--queue-ms 200"
nproc; python3 -c "import torch,sys; print(torch.__version__, sys.version.split()[0])"; uname -r
run() { t=$1; name=$2; shift 2; echo "== $name $(date +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"; timeout $t python3 $B "$@" --json $OUT/$name.json 2>&1 | grep -v "^\s*$" | cut -c1-400; }
run 120 emulated_resnet20_star9_100mbit_request_q200 --topology star:9 $E20 --pulls request $Q
run 120 emulated_resnet20_star5_100mbit_request_q200 --topology star:5 $E20 --pulls request $Q
run 120 emulated_resnet20_star9_100mbit_send_q200 --topology star:9 $E20 $Q
run 120 emulated_resnet20_star5_100mbit_send_q200 --topology star:5 $E20 $Q
run 290 emulated_googlenet_star5_250mbit_request_q200 --topology star:5 --rate 250mbit --model emulated:googlenet-cpu-b8 --batch 8 --iters 4 --rounds 2 --pulls request $Q
echo "== done $(date +%H:%M:%S)"
