#!/usr/bin/env bash
# Measures the node agent's memory and CPU over a long run with 8 twin GPUs
# against a local mosquitto (so the broker's own cost is not counted).
#
#   node-agent/benches/footprint.sh [SECONDS]     (default 600)
#
# Prints peak and final resident memory (VmHWM, VmRSS from /proc), CPU time
# (utime + stime from /proc/<pid>/stat) as a share of one core over the
# run, and the sampling jitter the agent measured (ctl status). Build
# first: cargo build --release -p node-agent.
set -euo pipefail
secs=${1:-600}
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${CARGO_TARGET_DIR:-$root/target}/release/node-agent
[ -x "$bin" ] || { echo "build first: cargo build --release -p node-agent" >&2; exit 1; }
command -v mosquitto >/dev/null || { echo "mosquitto is needed" >&2; exit 1; }
dir=$(mktemp -d)
trap 'kill $agent $broker 2>/dev/null || true; rm -rf "$dir"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
printf 'listener %s 127.0.0.1\nallow_anonymous true\n' "$port" > "$dir/m.conf"
mosquitto -c "$dir/m.conf" >/dev/null 2>&1 & broker=$!
sleep 0.5
"$bin" run --twin-gpus 8 --broker "127.0.0.1:$port" --site bench --host h01 \
  --flash "$dir/agent.flash" --console "$dir/agent.sock" 2>"$dir/agent.log" & agent=$!
sleep 5
tick=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$agent/stat"; }
c0=$(cpu); t0=$(date +%s.%N)
sleep "$secs"
c1=$(cpu); t1=$(date +%s.%N)
rss=$(awk '/VmRSS/ {print $2}' "/proc/$agent/status")
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$agent/status")
threads=$(awk '/Threads/ {print $2}' "/proc/$agent/status")
status=$("$bin" ctl --console "$dir/agent.sock" --json status)
python3 - "$c0" "$c1" "$t0" "$t1" "$tick" "$rss" "$hwm" "$threads" "$status" <<'PY'
import json, sys
c0, c1, t0, t1, tick = (float(x) for x in sys.argv[1:6])
rss, hwm, threads = (int(x) for x in sys.argv[6:9])
st = json.loads(sys.argv[9])
wall = t1 - t0
cpu = (c1 - c0) / tick
print(f"run: {wall:.0f} s, 8 twin GPUs, period {st['period_ms']} ms, {st['samples']} samples")
print(f"memory: VmRSS {rss/1024:.1f} MiB, peak VmHWM {hwm/1024:.1f} MiB, {threads} threads")
print(f"cpu: {cpu:.2f} s over {wall:.0f} s = {100*cpu/wall:.3f} % of one core")
j = st["jitter_ms"]
print(f"jitter (last {j['window']} ticks): p50 {j['p50']} ms, p99 {j['p99']} ms, max since start {j['max']} ms; sample round last {st['sample_ms']['last']} ms, max {st['sample_ms']['max']} ms")
print(f"bus: {st['bus']}")
PY
