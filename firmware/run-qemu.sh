#!/usr/bin/env bash
# A developer's run of the firmware under QEMU against the simulated CDU:
#
#   firmware/run-qemu.sh [SECONDS]        (default 60)
#
# builds the firmware (release, --locked) and loopwarden-hall, gives the
# simulated CDU a pseudo-terminal bridged by socat to a TCP port, serves
# Modbus RTU on it with a scenario behind the registers (default
# firmware/scenarios/leak-and-pump-trip.toml: rack 2 leaks at 20 s, pump
# A trips at 35 s), and boots the firmware in QEMU's mps2-an386 with its
# four UARTs: UART0 on that port, UART1 (the gateway link) as GATEWAY
# says (default: what the firmware sends the gateway, captured in
# gateway-up.bin), UART2 (the console) in console.log and UART3 (the
# debug port's trace) in trace.bin. After SECONDS it stops everything
# and shows what happened: the CDU's status lines, the firmware's status
# lines around the leak and the trip, the step's figures, and the trace
# replayed on this machine through the same decision path
# (examples/replay_trace.rs), its digests compared step by step.
#
# Environment: SCENARIO (a plant-scenario/1 file), OUT (where the logs
# go; default target/firmware/run), GATEWAY (a QEMU chardev for UART1,
# e.g. tcp:127.0.0.1:7001,server=on,wait=off), NO_BUILD=1 (use what is
# built).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
secs="${1:-60}"
scenario="${SCENARIO:-$here/scenarios/leak-and-pump-trip.toml}"
out="${OUT:-$root/target/firmware/run}"
elf="$root/target/firmware/thumbv7em-none-eabihf/release/loopwarden-firmware"
hall="$root/target/debug/loopwarden-hall"

for tool in qemu-system-arm socat python3; do
  command -v "$tool" >/dev/null || { echo "run-qemu.sh: $tool is not installed" >&2; exit 2; }
done

host=x86_64-unknown-linux-gnu
replay="$root/target/firmware/$host/release/examples/replay_trace"
if [ "${NO_BUILD:-0}" != 1 ]; then
  start=$(date +%s.%N)
  (cd "$here" && cargo build --release --locked --quiet)
  echo "firmware built in $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s: $elf"
  (cd "$here" && cargo build --release --locked --quiet --target "$host" --features host --example replay_trace)
  (cd "$root" && cargo build --quiet -p loopwarden-hall)
fi

rm -rf "$out"
mkdir -p "$out"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
# The pseudo-terminal first, then the listening socket QEMU connects to.
socat PTY,raw,echo=0,link="$out/cdu.pty" "TCP-LISTEN:$port,bind=127.0.0.1,reuseaddr,nodelay" 2>"$out/socat.log" &
pids+=($!)
for _ in $(seq 50); do [ -e "$out/cdu.pty" ] && break; sleep 0.1; done
[ -e "$out/cdu.pty" ] || { echo "run-qemu.sh: socat made no pseudo-terminal" >&2; exit 1; }

record=()
if "$hall" cdu --help 2>/dev/null | grep -q -- '--record'; then
  record=(--record "$out/cdu-record.jsonl")
fi
"$hall" cdu --serial "$out/cdu.pty" --baud 19200 --scenario "$scenario" "${record[@]}" >"$out/cdu.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do grep -q "serving" "$out/cdu.log" 2>/dev/null && break; sleep 0.1; done

wall_start=$(date +%s.%N)
qemu-system-arm -M mps2-an386 -nographic -icount shift=0 -monitor none \
  -serial "tcp:127.0.0.1:$port,nodelay=on" -serial "${GATEWAY:-file:$out/gateway-up.bin}" \
  -serial "file:$out/console.log" -serial "file:$out/trace.bin" \
  -kernel "$elf" >"$out/qemu.log" 2>&1 &
pids+=($!)
echo "running $secs s: CDU on $out/cdu.pty (TCP $port), console in $out/console.log, trace in $out/trace.bin"
sleep "$secs"
cleanup
trap - EXIT INT TERM
wall="$(python3 -c "print(round($(date +%s.%N) - $wall_start, 1))")"

echo
echo "== the simulated CDU (what it served)"
cat "$out/cdu.log"
echo
echo "== the firmware's console (UART2): boot, and every fifth step"
grep -v '^step ' "$out/console.log" | head -n 14
awk '/^step / { n++; if (n % 5 == 1) print }' "$out/console.log"
echo
python3 - "$out/console.log" "$elf" "$wall" "${record[1]:-}" <<'PY'
import json, re, subprocess, sys
trace, elf, wall, record = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
steps = [l for l in open(trace, errors="replace") if l.startswith("step ")]
def field(pattern, line, default=None):
    m = re.search(pattern, line)
    return m.group(1) if m else default
print("== what the steps show")
leak = next((l for l in steps if int(field(r"leaks (0b\d+)", l, "0b0"), 2) & 0b100), None)
after = steps[steps.index(leak):] if leak else []
shut = next((l for l in after if int(field(r"closed (0b\d+)", l, "0b0"), 2) & 0b100), None)
T, VALVES = r"t=(\d+)", r"valves_open (0b\d+)"
if leak:
    print("rack 2's leak first read at t=%s ms; valves_open written %s" % (field(T, leak), field(VALVES, leak)))
if shut:
    print("rack 2's valve reads closed from t=%s ms" % field(T, shut))
trip = next((l for l in steps if "pumps A off B on" in l), None)
if trip:
    print("pump B runs, pump A off, from t=%s ms (lead %s)" % (field(T, trip), field(r"lead (\w)", trip)))
if steps:
    last = steps[-1]
    print("steps %d; instructions per step median %s, max %s; stack peak %s B" % (
        len(steps), field(r"median (\d+)", last), field(r"max (\d+)", last), field(r"stack (\d+) B", last)))
boot = [l.strip() for l in open(trace, errors="replace") if l.startswith("boot: stack")]
if boot:
    print(boot[0])
try:
    size = subprocess.run(["llvm-size", "-A", elf], capture_output=True, text=True, check=True).stdout
    sections = {l.split()[0]: int(l.split()[1]) for l in size.splitlines() if len(l.split()) == 3 and l.split()[1].isdigit()}
    flash = sum(sections.get(s, 0) for s in (".vector_table", ".text", ".rodata", ".data"))
    ram = sum(sections.get(s, 0) for s in (".data", ".bss", ".uninit"))
    print(f"flash: {flash} bytes (.vector_table, .text, .rodata, .data); RAM: {ram} bytes of statics (.data, .bss, .uninit) besides the stack")
except (OSError, subprocess.CalledProcessError):
    pass
if record:
    writes = [json.loads(l) for l in open(record) if '"valves_open"' in l]
    closing = next((w for w in writes if w.get("kind") == "write" and not int(w.get("value", 15)) & 0b100), None)
    if closing:
        print(f"the CDU's record: valves_open = {closing['value']} written at sim {closing.get('sim_ms')} ms")
print(f"wall time of the run: {wall} s")
PY
echo
echo "== the trace (UART3) replayed on this machine"
"$replay" "$out/trace.bin"
