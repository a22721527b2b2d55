#!/usr/bin/env bash
# What Prometheus's /metrics costs the node agent: the same agent with
# 8 twin GPUs at 1 s, without `--metrics-listen`, with it but never
# scraped, and scraped by a real Prometheus every second.
#
#   node-agent/benches/metrics_cost.sh        (from the repository root)
#
# Build first: cargo build --release -p node-agent. Needs mosquitto,
# prometheus and promtool (Debian package prometheus), curl and python3.
# Results and how to read them: docs/benchmarks.md, "Prometheus metrics".
#
# A mosquitto on a free loopback port is the broker (so the broker's own
# cost is not the agent's). RUNS times, taking the modes in turn, it
# starts
#   node-agent run --twin-gpus 8 --site bench --host h01
#     --broker 127.0.0.1:P --console …  [--metrics-listen 127.0.0.1:M]
# (no flash file: the stores stay in memory), and measures:
#   VmRSS    resident memory, /proc/PID/status, at the end of the window;
#            VmHWM, the peak, at the same moment.
#   CPU      over STEADY_S from WINDOW_AT_S after start: utime + stime
#            from /proc/PID/stat (10 ms ticks), and the run time of the
#            threads from /proc/PID/task/*/schedstat (ns), for the agent
#            only (Prometheus's own CPU is not counted).
# Modes:
#   off       no --metrics-listen.
#   listen    --metrics-listen, never scraped (the server's idle cost).
#   scraped   --metrics-listen, and a Prometheus started just before the
#             agent scrapes it every 1 s (scrape_timeout 1 s); at the end
#             of the window the script also reads, from Prometheus's
#             API, the mean scrape duration and the samples per scrape
#             over the window, and the size of one answer (curl).
# Prints each run, then the median of each figure per mode.
# RUNS (3), WINDOW_AT_S (10), STEADY_S (60) and MODES ("off listen
# scraped") set the runs; a run takes about WINDOW_AT_S + STEADY_S + 1 s.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
runs=${RUNS:-3}
window_at=${WINDOW_AT_S:-10}
steady=${STEADY_S:-60}
modes=${MODES:-off listen scraped}
root=$(cd "$(dirname "$0")/../.." && pwd)
agent_bin=${CARGO_TARGET_DIR:-$root/target}/release/node-agent
[ -x "$agent_bin" ] || { echo "build first: cargo build --release -p node-agent" >&2; exit 1; }
need mosquitto prometheus promtool curl python3
bench_dir

port=$(free_port)
printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\n' "$port" > "$dir/m.conf"
mosquitto -c "$dir/m.conf" >"$dir/broker.log" 2>&1 &
broker=$!
pids+=("$broker")
sleep 0.5
kill -0 "$broker" 2>/dev/null || { echo "mosquitto did not start:" >&2; cat "$dir/broker.log" >&2; exit 1; }

# Sum of the run time of every thread of a process, ns.
threads_ns() {
  local f s=0 v
  for f in /proc/"$1"/task/*/schedstat; do
    v=$(cut -d' ' -f1 "$f" 2>/dev/null || echo 0)
    s=$((s + v))
  done
  echo "$s"
}
# A field of /proc/PID/status, kB.
status_kb() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }
# The value of an instant query's one series on Prometheus at $1, or NA.
promql() {
  python3 - "$1" "$2" <<'PY'
import json, sys, urllib.parse, urllib.request
url = f"http://{sys.argv[1]}/api/v1/query?" + urllib.parse.urlencode({"query": sys.argv[2]})
try:
    r = json.load(urllib.request.urlopen(url, timeout=5))["data"]["result"]
    print(f"{float(r[0]['value'][1]):.6f}" if r else "NA")
except Exception:
    print("NA")
PY
}

# Starts a Prometheus scraping $1 every second; prints "pid address".
start_prometheus() {
  local target=$1 run_dir=$2 addr
  addr=127.0.0.1:$(free_port)
  mkdir -p "$run_dir"
  printf 'global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: node-agent\n    static_configs:\n      - targets: [%s]\n' \
    "'$target'" > "$run_dir/prometheus.yml"
  prometheus --config.file="$run_dir/prometheus.yml" --storage.tsdb.path="$run_dir/data" \
    --web.listen-address="$addr" --log.level=warn >"$run_dir/prometheus.log" 2>&1 &
  echo "$! $addr"
}

results=$dir/results
: > "$results"

one_run() { # mode run
  local mode=$1 i=$2 metrics_args=() prom_pid="" prom_addr="" maddr
  maddr=127.0.0.1:$(free_port)
  if [ "$mode" != off ]; then metrics_args=(--metrics-listen "$maddr"); fi
  if [ "$mode" = scraped ]; then
    read -r prom_pid prom_addr < <(start_prometheus "$maddr" "$dir/prom-$i")
    pids+=("$prom_pid")
  fi
  local t0=$EPOCHREALTIME
  "$agent_bin" run --twin-gpus 8 --site bench --host h01 --broker "127.0.0.1:$port" \
    --console "$dir/agent-$mode-$i.sock" "${metrics_args[@]}" >"$dir/agent-$mode-$i.log" 2>&1 &
  local agent=$!
  pids+=("$agent")
  sleep_until "$t0" "$window_at"
  kill -0 "$agent" 2>/dev/null || { echo "$mode run $i: the agent exited:" >&2; cat "$dir/agent-$mode-$i.log" >&2; return 1; }
  local c0 n0 s0 c1 n1 s1 rss hwm
  c0=$(ticks "$agent"); n0=$(threads_ns "$agent"); s0=$EPOCHREALTIME
  sleep "$steady"
  c1=$(ticks "$agent"); n1=$(threads_ns "$agent"); s1=$EPOCHREALTIME
  rss=$(status_kb "$agent" VmRSS); hwm=$(status_kb "$agent" VmHWM)
  local scrape_ms=NA samples=NA bytes=NA up=NA lint=NA
  if [ "$mode" = scraped ]; then
    local w=$((steady - 5))
    up=$(promql "$prom_addr" "avg_over_time(up[${w}s])")
    scrape_ms=$(promql "$prom_addr" "avg_over_time(scrape_duration_seconds[${w}s]) * 1000")
    samples=$(promql "$prom_addr" "avg_over_time(scrape_samples_scraped[${w}s])")
    bytes=$(curl -s "http://$maddr/metrics" | wc -c)
    curl -s "http://$maddr/metrics" | promtool check metrics >/dev/null 2>&1 && lint=0 || lint=$?
    kill "$prom_pid" 2>/dev/null || true
  fi
  kill -TERM "$agent"; wait "$agent" 2>/dev/null || true
  python3 - "$mode" "$i" "$rss" "$hwm" "$c0" "$c1" "$tick" "$n0" "$n1" "$s0" "$s1" \
    "$up" "$scrape_ms" "$samples" "$bytes" "$lint" >>"$results" <<'PY'
import sys
mode, i, rss, hwm, c0, c1, tick, n0, n1, s0, s1, up, scrape, samples, size, lint = sys.argv[1:]
wall = float(s1) - float(s0)
cpu_ticks = (float(c1) - float(c0)) / float(tick)
cpu_ns = (int(n1) - int(n0)) / 1e9
print(mode, i, rss, hwm, f"{cpu_ticks * 1000:.0f}", f"{cpu_ns * 1000:.1f}",
      f"{cpu_ns / wall * 100:.3f}", up, scrape, samples, size, lint, f"{wall:.2f}")
PY
  tail -1 "$results"
}

machine
echo "$(prometheus --version 2>&1 | head -1); mosquitto on 127.0.0.1:$port"
echo "$runs runs of each of: $modes; CPU from ${window_at} s for ${steady} s, memory at its end"
echo "mode run VmRSS_kB VmHWM_kB cpu_ms(ticks) cpu_ms(schedstat) cpu_%_of_a_core up scrape_ms samples_per_scrape answer_bytes promtool_exit window_s"
each_run "$runs" "$modes"

medians "$results" "$steady" 32 2 - "$modes" \
  "resident memory (VmRSS)|2|kB" "peak (VmHWM)|3|kB" \
  "CPU, utime+stime|4|ms" "CPU, schedstat|5|ms" "CPU, share of a core|6|%" \
  "scrape duration|8|ms" "samples per scrape|9|" "answer size|10|B"
