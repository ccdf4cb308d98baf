#!/bin/bash
# tried and dropped: "one answering thread per server" (request mode: a server takes the requests from any
# worker in the order they come, one_answer_thread.patch, commit bda3050, reverted in the next; a thread
# per worker makes 25 threads at five co-located workers, 81 at nine): the request-mode cases of
# ../confirm/run.sh again. Run on a tree with the patch applied (git worktree add /tmp/b bda3050).
cd "${BENCH_TREE:-/work/main}"
B=benchmarks/ibatch_testbed.py; J=${J:-docs/data/ps/one_answer}
run() { name=$1; shift; echo "== $name $(date +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"; .venv/bin/python $B "$@" --json $J/$name.json 2>&1 | grep -v "^\s*$" ; sleep 30; }
R20="--model resnet20"; E20="--model emulated:resnet20-cpu-b32"
run emulated_resnet20_star5_100mbit_request --topology star:5 $E20 --batch 32 --pulls request
run emulated_resnet20_star9_100mbit_request --topology star:9 $E20 --batch 32 --pulls request
run resnet20_star3_500mbit_b16_request_cpus06 --topology star:3 --rate 500mbit $R20 --batch 16 --pulls request --cpus 0.6
run emulated_googlenet_star5_250mbit_request --topology star:5 --rate 250mbit --model emulated:googlenet-cpu-b8 --batch 8 --iters 4 --rounds 2 --pulls request
echo "== done $(date +%H:%M:%S)"
