# the runs that found the head start (2026-11-26, 2-core VM), in order: the probe settle variants
# (probe_settle.patch applied, not kept), the GIL switch interval in request
# mode (switch_interval.patch), then head_start_s recorded (hs_*). Run from /work/main at the time.
cd /work/main
for v in barrier2 sleep0.02 base; do
  echo "== $v $(date +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  DPCOMM_PROBE_SETTLE=$v .venv/bin/python benchmarks/ibatch_testbed.py --topology star:5 --model emulated:resnet20-cpu-b32 --batch 32 --json /tmp/exp/star5_$v.json 2>&1 | grep -v "^\s*$"
  sleep 30
done
echo "== done $(date +%H:%M:%S)"
cd /work/main
for v in 0.0005; do
  echo "== switch $v $(date +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  DPCOMM_SWITCH=$v .venv/bin/python benchmarks/ibatch_testbed.py --topology star:5 --model emulated:resnet20-cpu-b32 --batch 32 --pulls request --json /tmp/exp/star5_req_sw$v.json 2>&1 | grep -v "^\s*$"
  sleep 30
done
echo "== done $(date +%H:%M:%S)"
cd /work/main
E20="--model emulated:resnet20-cpu-b32"
run() { v=$1; name=$2; shift; shift; echo "== $name switch $v $(date +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"; DPCOMM_SWITCH=$v .venv/bin/python benchmarks/ibatch_testbed.py "$@" --json /tmp/exp/${name}_sw$v.json 2>&1 | grep -v "^\s*$"; sleep 30; }
run 0.0005 star9_req --topology star:9 $E20 --batch 32 --pulls request
run 0.0005 gnet5_req --topology star:5 --rate 250mbit --model emulated:googlenet-cpu-b8 --batch 8 --iters 4 --rounds 2 --pulls request
echo "== done $(date +%H:%M:%S)"
cd /work/main
E20="--model emulated:resnet20-cpu-b32"
run() { name=$1; shift; echo "== $name $(date +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"; .venv/bin/python benchmarks/ibatch_testbed.py "$@" --json /tmp/exp/${name}.json 2>&1 | grep -v "^\s*$"; sleep 30; }
run hs_star5_send --topology star:5 $E20 --batch 32
run hs_star9_send --topology star:9 $E20 --batch 32
echo "== done $(date +%H:%M:%S)"
