#!/usr/bin/env bash
# What TLS costs the node agent: the same agent against a plain MQTT
# listener and against a TLS listener with client certificates.
#
#   node-agent/benches/tls_cost.sh            (from the repository root)
#
# Build first: cargo build --release -p node-agent -p loopwarden-bus.
# Needs mosquitto, mosquitto_sub, ss (iproute2), stdbuf (coreutils), python3.
#
# It starts two mosquitto brokers on free loopback ports: a plain one
# (`listener P 127.0.0.1`, `allow_anonymous true`) and the TLS one that
# `lwbus pki init --site bench --hosts h01 --cdus cdu1 --operators ops1
# --readers bms1` writes (TLS on 127.0.0.1, client certificates required,
# the ACL). Then, RUNS times, alternating plain and TLS, it starts
# `node-agent run --twin-gpus 8 --site bench --host h01 --cdu cdu1
# --keyring DIR/keyring.toml` (and with TLS `--tls-ca --tls-cert
# --tls-key` of h01), no flash file (kept in memory), and measures:
#
#   connect  from just before the agent is started (bash $EPOCHREALTIME)
#            to the arrival of its `online` frame at a mosquitto_sub
#            subscribed beforehand (plain: no certificate; TLS: the
#            reader bms1's), stamped by mosquitto_sub (-F %U); stale
#            retained frames are skipped (-R). Process start, config,
#            TLS files, twin GPUs, TCP (and TLS) connect, MQTT CONNECT,
#            the publish and the broker's forwarding.
#   VmHWM    peak resident memory, /proc/PID/status, WARM_S after start.
#   CPU      over the STEADY_S that follow: utime + stime from
#            /proc/PID/stat (10 ms ticks), and the same from the threads'
#            /proc/PID/task/*/schedstat (ns; a thread that ends inside the
#            window loses its time, their number is printed), for the
#            agent and for the broker it talks to.
#   wire     bytes on the agent's TCP connection to the broker, both ways,
#            from `ss -tip` (bytes_sent + bytes_received: MQTT, and with
#            TLS its records; no TCP/IP headers), over the same window,
#            per minute.
#
# Prints each run, then the median of each figure over the runs.
# RUNS (default 10), WARM_S (10) and STEADY_S (30) set the runs; a run
# takes about WARM_S + STEADY_S + 1 s.
set -euo pipefail
runs=${RUNS:-10}
warm=${WARM_S:-10}
steady=${STEADY_S:-30}
root=$(cd "$(dirname "$0")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
agent_bin=$target/release/node-agent
lwbus_bin=$target/release/lwbus
for b in "$agent_bin" "$lwbus_bin"; do
  [ -x "$b" ] || { echo "build first: cargo build --release -p node-agent -p loopwarden-bus" >&2; exit 1; }
done
for c in mosquitto mosquitto_sub ss stdbuf python3; do
  command -v "$c" >/dev/null || { echo "$c is needed" >&2; exit 1; }
done

dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# The brokers.
plain_port=$(free_port)
printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\n' "$plain_port" > "$dir/plain.conf"
mosquitto -c "$dir/plain.conf" >"$dir/plain-broker.log" 2>&1 & plain_broker=$!
pids+=("$plain_broker")
tls_port=$(free_port)
while [ "$tls_port" = "$plain_port" ]; do tls_port=$(free_port); done
pki=$dir/pki
"$lwbus_bin" pki init --site bench --hosts h01 --cdus cdu1 --operators ops1 \
  --readers bms1 --out "$pki" --broker-port "$tls_port" >/dev/null
mosquitto -c "$pki/mosquitto.conf" >"$dir/tls-broker.log" 2>&1 & tls_broker=$!
pids+=("$tls_broker")
sleep 0.5
for p in "$plain_broker" "$tls_broker"; do
  kill -0 "$p" 2>/dev/null || { echo "a broker did not start:" >&2; cat "$dir"/*broker.log >&2; exit 1; }
done

topic=dc/v2/bench/host/h01/online
tick=$(getconf CLK_TCK)

# utime + stime of a process, ticks.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# "tid ns" for every thread of a process (run time from schedstat).
threads_ns() {
  local f
  for f in /proc/"$1"/task/*/schedstat; do
    local tid=${f%/schedstat}; tid=${tid##*/}
    echo "$tid $(cut -d' ' -f1 "$f" 2>/dev/null || echo 0)"
  done
}
# CPU ns between two threads_ns snapshots; prints "ns ended_threads".
threads_delta() {
  awk 'NR==FNR {a[$1]=$2; next} {seen[$1]=1; d += $2 - ($1 in a ? a[$1] : 0)}
       END {e=0; for (t in a) if (!(t in seen)) e++; printf "%d %d\n", d, e}' "$1" "$2"
}
# Bytes both ways on the TCP connections of process $1 to port $2.
wire_bytes() {
  ss -tinpH "( dport = :$2 )" | awk -v pid="pid=$1," '
    index($0, pid) {want=1; next}
    want { s=0; r=0
           if (match($0, /bytes_sent:[0-9]+/)) s=substr($0, RSTART+11, RLENGTH-11)
           if (match($0, /bytes_received:[0-9]+/)) r=substr($0, RSTART+15, RLENGTH-15)
           n += s + r; want=0 }
    END {print n+0}'
}

results=$dir/results
: > "$results"

one_run() { # mode run
  local mode=$1 i=$2 port broker_pid sub_args=() tls_args=()
  if [ "$mode" = plain ]; then
    port=$plain_port; broker_pid=$plain_broker
  else
    port=$tls_port; broker_pid=$tls_broker
    sub_args=(--cafile "$pki/ca.crt" --cert "$pki/bms1.crt" --key "$pki/bms1.key")
    tls_args=(--tls-ca "$pki/ca.crt" --tls-cert "$pki/h01.crt" --tls-key "$pki/h01.key")
  fi
  local sub_out=$dir/sub-$mode-$i.out
  timeout 30 stdbuf -oL mosquitto_sub -d -h 127.0.0.1 -p "$port" "${sub_args[@]}" -t "$topic" \
    -R -C 1 -F '%U' >"$sub_out" 2>&1 & local sub=$!
  local k
  for k in $(seq 100); do grep -q SUBACK "$sub_out" && break; sleep 0.05; done
  grep -q SUBACK "$sub_out" || { echo "$mode run $i: the subscriber did not subscribe" >&2; cat "$sub_out" >&2; return 1; }

  local t0=$EPOCHREALTIME
  "$agent_bin" run --twin-gpus 8 --site bench --host h01 --cdu cdu1 \
    --broker "127.0.0.1:$port" "${tls_args[@]}" --keyring "$pki/keyring.toml" \
    --console "$dir/agent-$mode-$i.sock" >"$dir/agent-$mode-$i.log" 2>&1 & local agent=$!
  pids+=("$agent")
  wait "$sub" || true
  local t1
  t1=$(grep -E '^[0-9]+\.[0-9]+$' "$sub_out" | head -1 || true)
  local connect_ms=NA
  [ -n "$t1" ] && connect_ms=$(python3 -c "print(f'{($t1 - $t0) * 1000:.1f}')")

  # Peak memory WARM_S after the start, then the steady window.
  python3 -c "import time; time.sleep(max(0.0, $t0 + $warm - time.time()))"
  kill -0 "$agent" 2>/dev/null || { echo "$mode run $i: the agent exited:" >&2; cat "$dir/agent-$mode-$i.log" >&2; return 1; }
  local hwm rss
  hwm=$(awk '/^VmHWM/ {print $2}' "/proc/$agent/status")
  rss=$(awk '/^VmRSS/ {print $2}' "/proc/$agent/status")
  local c0 b0 w0
  c0=$(ticks "$agent"); b0=$(ticks "$broker_pid"); w0=$(wire_bytes "$agent" "$port")
  threads_ns "$agent" > "$dir/a0"; threads_ns "$broker_pid" > "$dir/b0"
  local s0=$EPOCHREALTIME
  sleep "$steady"
  local c1 b1 w1
  c1=$(ticks "$agent"); b1=$(ticks "$broker_pid"); w1=$(wire_bytes "$agent" "$port")
  threads_ns "$agent" > "$dir/a1"; threads_ns "$broker_pid" > "$dir/b1"
  local s1=$EPOCHREALTIME
  local a_ns a_gone b_ns b_gone
  read -r a_ns a_gone < <(threads_delta "$dir/a0" "$dir/a1")
  read -r b_ns b_gone < <(threads_delta "$dir/b0" "$dir/b1")
  kill -TERM "$agent"; wait "$agent" 2>/dev/null || true

  python3 - "$mode" "$i" "$connect_ms" "$hwm" "$rss" "$c0" "$c1" "$b0" "$b1" "$tick" \
    "$a_ns" "$a_gone" "$b_ns" "$s0" "$s1" "$w0" "$w1" >>"$results" <<'PY'
import sys
(mode, i, connect, hwm, rss, c0, c1, b0, b1, tick, a_ns, a_gone, b_ns, s0, s1, w0, w1) = sys.argv[1:]
wall = float(s1) - float(s0)
tick = float(tick)
print(mode, i, connect, int(hwm), int(rss),
      f"{(float(c1) - float(c0)) / tick * 1000:.0f}",
      f"{int(a_ns) / 1e6:.1f}", a_gone,
      f"{(float(b1) - float(b0)) / tick * 1000:.0f}",
      f"{int(b_ns) / 1e6:.1f}",
      f"{(int(w1) - int(w0)) * 60 / wall:.0f}", f"{wall:.2f}")
PY
  tail -1 "$results"
}

echo "machine: $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), $(uname -sr); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "plain broker 127.0.0.1:$plain_port, TLS broker 127.0.0.1:$tls_port; $runs runs each, peak memory at ${warm} s, CPU and wire over ${steady} s"
echo "mode run connect_ms VmHWM_kB VmRSS_kB agent_cpu_ms(ticks) agent_cpu_ms(schedstat) threads_ended broker_cpu_ms(ticks) broker_cpu_ms(schedstat) wire_B_per_min window_s"
for i in $(seq "$runs"); do
  one_run plain "$i"
  one_run tls "$i"
done
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$results" "$steady" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
steady = float(sys.argv[2])
cols = [("connect to online seen", 2, "ms"), ("peak RSS (VmHWM)", 3, "kB"),
        ("agent CPU, utime+stime", 5, "ms"), ("agent CPU, schedstat", 6, "ms"),
        ("broker CPU, utime+stime", 8, "ms"), ("broker CPU, schedstat", 9, "ms"),
        ("agent<->broker bytes", 10, "B/min")]
print()
print(f"medians over the runs (CPU over {steady:.0f} s):")
print(f"{'':26} {'plain':>12} {'TLS':>12} {'TLS - plain':>12}  (min - max plain | min - max TLS)")
for name, c, unit in cols:
    def vals(mode):
        return [float(r[c]) for r in rows if r[0] == mode and r[c] != "NA"]
    p, t = vals("plain"), vals("tls")
    if not p or not t:
        print(f"{name:26} no data")
        continue
    mp, mt = statistics.median(p), statistics.median(t)
    print(f"{name:26} {mp:>12.1f} {mt:>12.1f} {mt - mp:>+12.1f}  {unit}  "
          f"({min(p):.1f} - {max(p):.1f} | {min(t):.1f} - {max(t):.1f}; n={len(p)}/{len(t)})")
ended = sum(int(r[7]) for r in rows)
print(f"agent threads that ended inside a window (their CPU not in the schedstat figure): {ended}")
PY
