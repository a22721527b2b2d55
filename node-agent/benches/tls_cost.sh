#!/usr/bin/env bash
# What TLS costs the node agent: the same agent against a plain MQTT
# listener and against a TLS listener with client certificates.
#
#   node-agent/benches/tls_cost.sh            (from the repository root)
#
# Build first: cargo build --release -p node-agent -p loopwarden-bus.
# Needs mosquitto, mosquitto_sub, ss (iproute2), stdbuf (coreutils) and
# python3. Results and how to read them: docs/benchmarks.md, "Bus
# security: signatures and TLS".
#
# Brokers, each a mosquitto on a free loopback port:
#   plain        `listener P 127.0.0.1`, `allow_anonymous true`.
#   tls          the mosquitto.conf that `lwbus pki init --site bench
#                --hosts h01 --cdus cdu1 --operators ops1 --readers bms1`
#                writes (TLS, client certificates required, the ACL) less
#                its `set_tcp_nodelay true`: mosquitto's default, to show
#                what Nagle's algorithm on the broker's sockets adds to
#                the TLS connect.
#   tls_nodelay  that mosquitto.conf as written.
# RUNS times, taking the modes in turn, it starts
#   node-agent run --twin-gpus 8 --site bench --host h01 --cdu cdu1
#     --broker 127.0.0.1:P --keyring DIR/keyring.toml --console …
# (with TLS also --tls-ca --tls-cert --tls-key of h01; no flash file, so
# the agent keeps its stores in memory), and measures:
#   connect  from just before the agent is started (bash $EPOCHREALTIME)
#            to the arrival of its `online` frame at a mosquitto_sub
#            subscribed beforehand (plain: no certificate; TLS: the
#            reader bms1's), stamped by mosquitto_sub (-F %U); a stale
#            retained frame is skipped (-R). It covers process start,
#            configuration, TLS files, twin GPUs, TCP (and TLS) connect,
#            MQTT CONNECT, the publish and the broker forwarding it.
#   VmHWM    peak resident memory, /proc/PID/status, MEM_AT_S after start.
#   CPU      over STEADY_S from WINDOW_AT_S after start: utime + stime
#            from /proc/PID/stat (10 ms ticks), and the run time of the
#            threads from /proc/PID/task/*/schedstat (ns; a thread that
#            ends inside the window loses its time: their number is
#            printed), for the agent and for the broker it talks to.
#   wire     bytes on the agent's TCP connection to the broker over the
#            same window, from `ss -tip` (bytes_sent, bytes_received:
#            MQTT, and with TLS its records; no TCP/IP headers), per
#            minute. The agent sends the JSON mirror of its telemetry
#            every 10 s, starting at its start; the default window (15 s
#            to 45 s) holds three of them in every run.
# Prints each run, then the median of each figure per mode.
# RUNS (10), MEM_AT_S (10), WINDOW_AT_S (15), STEADY_S (30) and MODES
# ("plain tls tls_nodelay") set the runs; a run takes about
# WINDOW_AT_S + STEADY_S + 1 s.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
runs=${RUNS:-10}
mem_at=${MEM_AT_S:-10}
window_at=${WINDOW_AT_S:-15}
steady=${STEADY_S:-30}
modes=${MODES:-plain tls tls_nodelay}
root=$(cd "$(dirname "$0")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
agent_bin=$target/release/node-agent
lwbus_bin=$target/release/lwbus
for b in "$agent_bin" "$lwbus_bin"; do
  [ -x "$b" ] || { echo "build first: cargo build --release -p node-agent -p loopwarden-bus" >&2; exit 1; }
done
need mosquitto mosquitto_sub ss stdbuf python3
bench_dir

# The brokers: port and pid per mode.
declare -A port broker
port[plain]=$(free_port)
port[tls]=$(free_port)
port[tls_nodelay]=$(free_port)
pki=$dir/pki
"$lwbus_bin" pki init --site bench --hosts h01 --cdus cdu1 --operators ops1 \
  --readers bms1 --out "$pki" --broker-port "${port[tls]}" >/dev/null
printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\n' "${port[plain]}" \
  > "$dir/plain.conf"
grep -v '^set_tcp_nodelay' "$pki/mosquitto.conf" > "$dir/tls.conf"
sed -e "s/^listener ${port[tls]} /listener ${port[tls_nodelay]} /" "$pki/mosquitto.conf" \
  > "$dir/tls_nodelay.conf"
grep -q '^set_tcp_nodelay true' "$dir/tls_nodelay.conf" \
  || echo "set_tcp_nodelay true" >> "$dir/tls_nodelay.conf"
for m in plain tls tls_nodelay; do
  mosquitto -c "$dir/$m.conf" >"$dir/$m-broker.log" 2>&1 &
  broker[$m]=$!
  pids+=("${broker[$m]}")
done
sleep 0.5
for m in plain tls tls_nodelay; do
  kill -0 "${broker[$m]}" 2>/dev/null || { echo "the $m broker did not start:" >&2; cat "$dir/$m-broker.log" >&2; exit 1; }
done

topic=dc/v2/bench/host/h01/online

# "tid ns" for every thread of a process (run time from schedstat).
threads_ns() {
  local f tid
  for f in /proc/"$1"/task/*/schedstat; do
    tid=${f%/schedstat}; tid=${tid##*/}
    echo "$tid $(cut -d' ' -f1 "$f" 2>/dev/null || echo 0)"
  done
}
# CPU ns between two threads_ns snapshots; prints "ns ended_threads".
threads_delta() {
  awk 'NR==FNR {a[$1]=$2; next} {seen[$1]=1; d += $2 - ($1 in a ? a[$1] : 0)}
       END {e=0; for (t in a) if (!(t in seen)) e++; printf "%d %d\n", d, e}' "$1" "$2"
}
# "sent received" bytes on the TCP connections of process $1 to port $2.
wire_bytes() {
  ss -tinpH "( dport = :$2 )" | awk -v pid="pid=$1," '
    index($0, pid) {want=1; next}
    want { if (match($0, /bytes_sent:[0-9]+/)) s += substr($0, RSTART+11, RLENGTH-11)
           if (match($0, /bytes_received:[0-9]+/)) r += substr($0, RSTART+15, RLENGTH-15)
           want=0 }
    END {print s+0, r+0}'
}

results=$dir/results
: > "$results"

one_run() { # mode run
  local mode=$1 i=$2
  local p=${port[$mode]} broker_pid=${broker[$mode]} sub_args=() tls_args=()
  if [ "$mode" != plain ]; then
    sub_args=(--cafile "$pki/ca.crt" --cert "$pki/bms1.crt" --key "$pki/bms1.key")
    tls_args=(--tls-ca "$pki/ca.crt" --tls-cert "$pki/h01.crt" --tls-key "$pki/h01.key")
  fi
  local sub_out=$dir/sub-$mode-$i.out
  timeout 30 stdbuf -oL mosquitto_sub -d -h 127.0.0.1 -p "$p" "${sub_args[@]}" -t "$topic" \
    -R -C 1 -F '%U' >"$sub_out" 2>&1 &
  local sub=$! k
  for k in $(seq 100); do grep -q SUBACK "$sub_out" && break; sleep 0.05; done
  grep -q SUBACK "$sub_out" || { echo "$mode run $i: the subscriber did not subscribe" >&2; cat "$sub_out" >&2; return 1; }

  local t0=$EPOCHREALTIME
  "$agent_bin" run --twin-gpus 8 --site bench --host h01 --cdu cdu1 \
    --broker "127.0.0.1:$p" "${tls_args[@]}" --keyring "$pki/keyring.toml" \
    --console "$dir/agent-$mode-$i.sock" >"$dir/agent-$mode-$i.log" 2>&1 &
  local agent=$!
  pids+=("$agent")
  wait "$sub" || true
  local t1 connect_ms=NA
  t1=$(grep -E '^[0-9]+\.[0-9]+$' "$sub_out" | head -1 || true)
  [ -n "$t1" ] && connect_ms=$(python3 -c "print(f'{($t1 - $t0) * 1000:.1f}')")

  sleep_until "$t0" "$mem_at"
  kill -0 "$agent" 2>/dev/null || { echo "$mode run $i: the agent exited:" >&2; cat "$dir/agent-$mode-$i.log" >&2; return 1; }
  local hwm
  hwm=$(awk '/^VmHWM/ {print $2}' "/proc/$agent/status")

  sleep_until "$t0" "$window_at"
  local c0 b0 w0 c1 b1 w1 s0 s1
  c0=$(ticks "$agent"); b0=$(ticks "$broker_pid"); w0=$(wire_bytes "$agent" "$p")
  threads_ns "$agent" > "$dir/a0"; threads_ns "$broker_pid" > "$dir/b0"
  s0=$EPOCHREALTIME
  sleep "$steady"
  c1=$(ticks "$agent"); b1=$(ticks "$broker_pid"); w1=$(wire_bytes "$agent" "$p")
  threads_ns "$agent" > "$dir/a1"; threads_ns "$broker_pid" > "$dir/b1"
  s1=$EPOCHREALTIME
  local a_ns a_gone b_ns b_gone
  read -r a_ns a_gone < <(threads_delta "$dir/a0" "$dir/a1")
  read -r b_ns b_gone < <(threads_delta "$dir/b0" "$dir/b1")
  kill -TERM "$agent"; wait "$agent" 2>/dev/null || true

  python3 - "$mode" "$i" "$connect_ms" "$hwm" "$c0" "$c1" "$b0" "$b1" "$tick" \
    "$a_ns" "$a_gone" "$b_ns" "$s0" "$s1" $w0 $w1 >>"$results" <<'PY'
import sys
(mode, i, connect, hwm, c0, c1, b0, b1, tick, a_ns, a_gone, b_ns, s0, s1,
 sent0, recv0, sent1, recv1) = sys.argv[1:]
wall = float(s1) - float(s0)
tick = float(tick)
per_min = lambda a, b: f"{(int(b) - int(a)) * 60 / wall:.0f}"
print(mode, i, connect, int(hwm),
      f"{(float(c1) - float(c0)) / tick * 1000:.0f}",
      f"{int(a_ns) / 1e6:.1f}", a_gone,
      f"{(float(b1) - float(b0)) / tick * 1000:.0f}",
      f"{int(b_ns) / 1e6:.1f}",
      per_min(sent0, sent1), per_min(recv0, recv1), f"{wall:.2f}")
PY
  tail -1 "$results"
}

machine
echo "brokers on 127.0.0.1: plain :${port[plain]}, tls :${port[tls]}, tls_nodelay :${port[tls_nodelay]}"
echo "$runs runs of each of: $modes; VmHWM at ${mem_at} s; CPU and wire from ${window_at} s for ${steady} s"
echo "mode run connect_ms VmHWM_kB agent_cpu_ms(ticks) agent_cpu_ms(schedstat) threads_ended broker_cpu_ms(ticks) broker_cpu_ms(schedstat) sent_B_per_min received_B_per_min window_s"
each_run "$runs" "$modes"

medians "$results" "$steady" 30 1 "no data" "$modes" \
  "connect to online seen|2|ms" "peak RSS (VmHWM)|3|kB" \
  "agent CPU, utime+stime|4|ms" "agent CPU, schedstat|5|ms" \
  "broker CPU, utime+stime|7|ms" "broker CPU, schedstat|8|ms" \
  "agent bytes sent|9|B/min" "agent bytes received|10|B/min"
python3 - "$results" $modes <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1])]
modes = sys.argv[2:]
print("runs per mode: " + ", ".join(f"{m} {sum(1 for r in rows if r[0] == m and r[2] != 'NA')}" for m in modes))
print(f"agent threads that ended inside a window (their CPU not in the schedstat figure): {sum(int(r[6]) for r in rows)}")
PY
