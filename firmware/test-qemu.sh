#!/usr/bin/env bash
# firmware/test-qemu.sh: the CDU controller as firmware, end to end, in QEMU.
#
# The firmware runs on QEMU's mps2-an386 (a Cortex-M4F) with -icount
# shift=0 (one instruction, one nanosecond of the board's time):
#   UART0  Modbus RTU, 19,200 8N1, to the simulated CDU
#          (`loopwarden-hall cdu --serial`, answering 60 ms after each
#          request, on a pseudo-terminal socat bridges to QEMU's socket)
#   UART1  the link to its gateway (`cooling-ctrl gateway`), itself on a
#          mosquitto broker
#   UART2  the console (text), to a file
#   UART3  the trace (every input of the decision path), to a file
# The firmware is built with the figures of the scenario's hall (its
# [site] table, the hall the simulated CDU plays; none: the twin's own),
# written by `cooling-ctrl firmware-figures` (LOOPWARDEN_FIRMWARE_FIGURES),
# and the trace is replayed with them.
# The CDU plays firmware/scenarios/leak-and-pump-trip.toml: rack 2 leaks at
# 20 s, the lead pump A trips at 35 s. The gateway is killed at 12 s and
# started again at 42 s; the board dies at 50 s, and the run ends when
# the CDU has fallen back on its own and the gateway has said so on the bus.
#
#   firmware/test-qemu.sh            build, run, check; KEEP=1 keeps the logs
#
# Its last line of standard output is one JSON object (docs/firmware.md
# says what each field is); it exits 1 when a check fails, 2 when a tool is
# missing.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

say() { echo "test-qemu: $*" >&2; }
for tool in qemu-system-arm socat mosquitto mosquitto_sub python3; do
  command -v "$tool" >/dev/null 2>&1 || { say "$tool is not installed"; exit 2; }
done

WORK=$(mktemp -d /tmp/loopwarden-qemu.XXXXXX)
declare -A PID=()
stop() { # stop NAME: SIGTERM, then wait for it
  local p=${PID[$1]:-}
  [ -n "$p" ] || return 0
  kill "$p" 2>/dev/null || true
  kill -CONT "$p" 2>/dev/null || true # a frozen board takes its SIGTERM too
  wait "$p" 2>/dev/null || true
  unset "PID[$1]"
}
cleanup() {
  for n in "${!PID[@]}"; do stop "$n"; done
  if [ "${KEEP:-0}" = 1 ]; then say "logs kept in $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT INT TERM

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
wait_until() { # wait_until SECONDS WHAT COMMAND...: polls COMMAND
  local end=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$end" ] || { say "gave up waiting for $what"; exit 1; }
    sleep 0.1
  done
}
# Seconds since the CDU started serving, on this script's clock.
since_start() { python3 -c "import time; print(round(time.time() - $T0, 3))"; }
at() { # at SECONDS: sleeps until then
  python3 -c "import time; time.sleep(max(0.0, $1 - (time.time() - $T0)))"
}

SCENARIO=firmware/scenarios/leak-and-pump-trip.toml
# The CDU answers each request 60 ms after it, as real CDUs' controllers
# take tens of milliseconds: every step's two reads, six writes and the
# read-back of its safety settings must still go in within its budget.
TURNAROUND_MS=60
say "building the host side, the hall's figures and the firmware (release)"
build_start=$SECONDS
cargo build --locked --quiet -p loopwarden-hall -p cooling-ctrl
BIN=$ROOT/target/debug
# The scenario's [site] table as a site figures file (empty: the twin's
# own hall, SiteConfig's defaults, as loopwarden-hall cdu plays it).
python3 - "$SCENARIO" "$WORK/site.toml" <<'EOF'
import json, sys, tomllib
site = tomllib.load(open(sys.argv[1], "rb")).get("site", {})
out = ["# The site figures of " + sys.argv[1] + "'s hall ([site])."]
def emit(table, prefix):
    if prefix:
        out.append("[" + prefix + "]")
    for k, v in table.items():
        if not isinstance(v, dict):
            out.append(k + " = " + json.dumps(v))
    for k, v in table.items():
        if isinstance(v, dict):
            emit(v, prefix + "." + k if prefix else k)
emit(site, "")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
EOF
FIGURES=$WORK/figures.bin
"$BIN/cooling-ctrl" firmware-figures --site-figures "$WORK/site.toml" --out "$FIGURES" \
  2>"$WORK/figures.log" || { cat "$WORK/figures.log" >&2; exit 1; }
say "$(sed 's/^cooling-ctrl firmware-figures: //' "$WORK/figures.log")"
(cd firmware && LOOPWARDEN_FIRMWARE_FIGURES=$FIGURES cargo build --release --locked --quiet)
say "built in $((SECONDS - build_start)) s"
ELF=$ROOT/target/firmware/thumbv7em-none-eabihf/release/loopwarden-firmware

MQTT=$(free_port)
UART0=$(free_port)
UART1=$(free_port)
cat >"$WORK/mosquitto.conf" <<EOF
listener $MQTT 127.0.0.1
allow_anonymous true
persistence false
EOF
mosquitto -c "$WORK/mosquitto.conf" >"$WORK/mosquitto.log" 2>&1 &
PID[broker]=$!
cat >"$WORK/gateway.toml" <<EOF
# The gateway of the QEMU test: this CDU on the test's broker.
site = "hall-q"
cdu = "cdu-1"
broker = "127.0.0.1:$MQTT"
demo_key = true
hosts_pattern = "r{rack}h{host}"
flash = "$WORK/gateway.flash"
# Its own console socket: another run's gateway (or a controller of this
# host) on the default socket must not make this one's restart fail.
console = "$WORK/gateway.sock"
EOF
gateway() {
  "$BIN/cooling-ctrl" gateway --link "tcp:127.0.0.1:$UART1" --config "$WORK/gateway.toml" \
    >>"$WORK/gateway.log" 2>&1 &
  PID[gateway]=$!
}

# The CDU's state as the bus carries it (the JSON mirror), stamped on
# arrival with this script's clock.
wait_until 10 "the broker" bash -c "exec 3<>/dev/tcp/127.0.0.1/$MQTT"
mosquitto_sub -h 127.0.0.1 -p "$MQTT" -t 'dc/v2/hall-q/json/cdu/cdu-1/health' \
  -F '%U %p' >"$WORK/state.log" 2>"$WORK/mosquitto_sub.err" &
PID[sub]=$!

socat PTY,raw,echo=0,link="$WORK/cdu.pty" \
  "TCP-LISTEN:$UART0,bind=127.0.0.1,reuseaddr,nodelay" 2>"$WORK/socat.log" &
PID[socat]=$!
wait_until 5 "socat's pseudo-terminal" test -e "$WORK/cdu.pty"
"$BIN/loopwarden-hall" cdu --serial "$WORK/cdu.pty" --baud 19200 --turnaround-ms "$TURNAROUND_MS" \
  --scenario "$SCENARIO" --record "$WORK/cdu.jsonl" \
  >"$WORK/cdu.log" 2>&1 &
PID[cdu]=$!
wait_until 10 "the simulated CDU" grep -q '"kind":"start"' "$WORK/cdu.jsonl"
T0=$(python3 -c 'import time; print(time.time())')

qemu-system-arm -M mps2-an386 -nographic -monitor none -icount shift=0 \
  -serial "tcp:127.0.0.1:$UART0,nodelay=on" \
  -serial "tcp:127.0.0.1:$UART1,server=on,wait=off,nodelay=on" \
  -serial "file:$WORK/console.log" -serial "file:$WORK/trace.bin" \
  -kernel "$ELF" >"$WORK/qemu.log" 2>&1 &
PID[qemu]=$!
gateway
say "running: leak at 20 s, pump trip at 35 s; logs in $WORK"

marks=()
at 12
stop gateway
marks+=("\"gateway_killed_s\": $(since_start)")
at 42
gateway
marks+=("\"gateway_started_s\": $(since_start)")
at 50
# The board dies: QEMU frozen (SIGSTOP), so it says and writes nothing
# more while its lines stay connected, as a board that lost its power.
kill -STOP "${PID[qemu]}"
marks+=("\"mcu_killed_s\": $(since_start)")
# The CDU falls back 10 s after the last heartbeat; the gateway speaks at 3 s.
end=$((SECONDS + 20))
until grep -q '"kind":"fallback","on":true' "$WORK/cdu.jsonl" 2>/dev/null &&
  grep -q 'controller-silent' "$WORK/state.log" 2>/dev/null; do
  [ "$SECONDS" -lt "$end" ] || break
  sleep 0.2
done
stop gateway
stop cdu
stop sub

# The board was frozen where it stood: its trace may end inside a frame.
# The capture is cut after its last whole frame (its last end byte);
# replay-trace counts any other frame cut or dropped as a mismatch.
python3 -c 'import sys; p = sys.argv[1]; b = open(p, "rb").read(); open(p, "wb").write(b[: b.rfind(b"\0") + 1])' "$WORK/trace.bin"
"$BIN/cooling-ctrl" replay-trace --figures "$FIGURES" "$WORK/trace.bin" >"$WORK/replay.json"
python3 firmware/test-qemu-figures.py --elf "$ELF" --record "$WORK/cdu.jsonl" \
  --replay "$WORK/replay.json" --state "$WORK/state.log" --t0 "$T0" \
  --marks "{$(IFS=,; echo "${marks[*]}")}" --console "$WORK/console.log"
