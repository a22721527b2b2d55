#!/usr/bin/env bash
# What the agent costs on a real GPU host against nvidia-smi reading the
# same fields at the same period, side by side:
#
#   node-agent/benches/nvml_cost.sh [SECONDS] [PERIOD_MS]
#
# Runs `node-agent run` (NODE_AGENT, default `node-agent` on the PATH) and
# `nvidia-smi --query-gpu=<the agent's per-period fields> -lms PERIOD_MS`
# together for SECONDS (default 60) after a 10 s warm-up, reads each
# process's CPU time (utime + stime, /proc/PID/stat) over that window and
# its peak RSS (VmHWM, /proc/PID/status), and prints one table.
#
# Read only. It refuses to run unless every GPU's power limit equals its
# default (so the agent, whose ceiling is the limit it finds, has nothing
# to put back), starts the agent with no command taken (`commands =
# "none"`, `cooling = "not_managed"`, and so `persistence =
# "not_required"`: it leaves no cap to keep) and its thermal guard above the
# GPU's slowdown (engage 91 °C), and checks after the run that every
# limit is still what it was. It never sets a limit, clocks or MIG.
#
# The agent runs with the embedded broker unless NVML_COST_BROKER names
# one (host:port): the broker's own cost is then outside the agent.
set -euo pipefail

secs=${1:-60}
period=${2:-1000}
agent=${NODE_AGENT:-node-agent}
warm=10
fields=temperature.gpu,temperature.memory,power.draw,enforced.power.limit,clocks.sm,clocks.mem,utilization.gpu,clocks_event_reasons.active,ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total,power.limit

die() { echo "nvml_cost: $*" >&2; exit 2; }
command -v nvidia-smi >/dev/null || die "nvidia-smi is not installed: run this on a GPU host"
command -v "$agent" >/dev/null || [ -x "$agent" ] || die "no node-agent at $agent (set NODE_AGENT)"

limits() {
  nvidia-smi --query-gpu=index,power.limit,power.default_limit --format=csv,noheader,nounits
}
before=$(limits)
while IFS=', ' read -r idx limit default; do
  [ "$limit" = "$default" ] || die "GPU $idx's power limit is $limit W, not its default $default W: refusing to run"
done <<<"$before"

dir=$(mktemp -d)
trap 'kill "${apid:-}" "${spid:-}" 2>/dev/null || true; rm -rf "$dir"' EXIT
broker_line='embedded_broker = true'
if [ -n "${NVML_COST_BROKER:-}" ]; then
  broker_line="broker = \"$NVML_COST_BROKER\""
fi
cat >"$dir/agent.toml" <<EOF
site = "nvml-cost"
host = "nvml-cost"
$broker_line
commands = "none"
cooling = "not_managed"
persistence = "not_required"
period_ms = $period
flash = "$dir/agent.flash"
console = "$dir/agent.sock"
[guard]
engage_c = 91
release_c = 86
[quarantine]
reported_only = true
EOF

"$agent" run --config "$dir/agent.toml" 2>"$dir/agent.log" &
apid=$!
nvidia-smi --query-gpu="$fields" --format=csv,noheader -lms "$period" >"$dir/smi.csv" 2>"$dir/smi.log" &
spid=$!
sleep "$warm"
for p in $apid $spid; do
  kill -0 "$p" 2>/dev/null || { cat "$dir/agent.log" "$dir/smi.log" >&2; die "process $p ended during the warm-up"; }
done

hz=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
a0=$(cpu_ticks $apid); s0=$(cpu_ticks $spid); t0=$(date +%s.%N)
sleep "$secs"
a1=$(cpu_ticks $apid); s1=$(cpu_ticks $spid); t1=$(date +%s.%N)
peak() { awk '/^VmHWM:/ {print $2}' "/proc/$1/status"; }
arss=$(peak $apid); srss=$(peak $spid)
kill -TERM $apid $spid
wait $apid 2>/dev/null || true
wait $spid 2>/dev/null || true

after=$(limits)
[ "$before" = "$after" ] || die "a power limit changed during the run: before $before, after $after"

gpus=$(wc -l <<<"$before")
rounds=$(awk -v s="$secs" -v p="$period" 'BEGIN {printf "%d", s * 1000 / p}')
row() { # name ticks0 ticks1 rss_kib
  awk -v n="$1" -v a="$2" -v b="$3" -v hz="$hz" -v t0="$t0" -v t1="$t1" -v r="$4" -v rounds="$rounds" 'BEGIN {
    cpu = (b - a) / hz; wall = t1 - t0
    printf "| %s | %.3f %% | %.2f ms | %.1f MB |\n", n, 100 * cpu / wall, 1000 * cpu / rounds, r * 1024 / 1e6 }'
}
echo "nvml_cost: $gpus GPU(s), period $period ms, $secs s measured after $warm s; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)"
echo "| process | CPU, share of one core | CPU per round | peak RSS |"
echo "|---|---:|---:|---:|"
row "node-agent ($([ -n "${NVML_COST_BROKER:-}" ] && echo "broker $NVML_COST_BROKER" || echo "embedded broker"))" "$a0" "$a1" "$arss"
row "nvidia-smi -lms $period (11 fields)" "$s0" "$s1" "$srss"
awk -v a=$((a1 - a0)) -v s=$((s1 - s0)) -v ar="$arss" -v sr="$srss" 'BEGIN {
  printf "ratio: CPU %.2f (target <= 1.0), RSS %.2f (target <= 1.2)\n", (s > 0 ? a / s : 0), ar / sr }'
