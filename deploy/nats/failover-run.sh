#!/usr/bin/env bash
# Delivery across a node's death: a fresh three-node cluster
# (cluster.sh), `loopwarden-hall fleet` on it (agents given all three
# nodes, the observer on node 3), node 1 killed (SIGKILL) and started
# again during the run; prints the events the broker acknowledged, the
# ones it never delivered to the observer, and of those the ones the
# observer did not get either as resent by their host (docs/brokers.md
# §2.3, §2.4).
#
#   failover-run.sh [OUT]
#
# OUT (default ${TMPDIR:-/tmp}/loopwarden-failover-<date>) receives:
#   report.json      the fleet's report (--json)
#   fleet.log        its log (the acknowledged events never received,
#                    nor resent, are named there, host and frame)
#   witness.txt      the events a second QoS 1 subscriber on node 2
#                    received (mosquitto_sub, persistent session): an
#                    event the observer lacks but the witness has was in
#                    the stream
#   state-*.txt      each running node's view of the MQTT streams and
#                    consumers (/jsz) before the kill, after it, after the
#                    restart and 2 s before the halls end; jsz-*.json the
#                    raw answers
#   cluster/         the nodes' stores and logs (nN.log)
#   consumers.txt    every 2 s, from each running node: $MQTT_msgs's last
#                    sequence and each consumer's name, filter, leader and
#                    last delivered stream/consumer sequence S/C (for a
#                    consumer that matches every message, S - C is what
#                    it stepped over less what it delivered again)
#   summary.txt      the figures, the agents and controllers that ended
#                    before told to stop, and how many stream messages the
#                    observer's consumer stepped over (consumers.txt)
#
# Settings (environment):
#   HOSTS (200), CDUS (2), DURATION (300 s), KILL_AT (100 s),
#   RESTART_AT (200 s): seconds into the halls' run (the fleet's clock
#   starts once every agent is connected); KILL_NODE (1); OBSERVER_NODE
#   (3); WITNESS_NODE (2; 0: no witness); HALL (the release build of
#   loopwarden-hall); NATS_BASE_PORT, NATS_MQTT_MSGS_MAX_AGE (0: the
#   QoS 1 stream as NATS makes it, for comparison) and the others of
#   cluster.sh.
#   The shorter shape used while investigating:
#   DURATION=120 KILL_AT=40 RESTART_AT=80.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cluster="$here/cluster.sh"

hosts="${HOSTS:-200}"
cdus="${CDUS:-2}"
duration="${DURATION:-300}"
kill_at="${KILL_AT:-100}"
restart_at="${RESTART_AT:-200}"
kill_node="${KILL_NODE:-1}"
observer_node="${OBSERVER_NODE:-3}"
witness_node="${WITNESS_NODE:-2}"
hall="${HALL:-$root/target/release/loopwarden-hall}"
out="${1:-${TMPDIR:-/tmp}/loopwarden-failover-$(date +%Y%m%d-%H%M%S)}"

die() {
  echo "failover-run.sh: $*" >&2
  exit 1
}

[[ -x "$hall" ]] || die "no $hall: cargo build --release -p loopwarden-hall (or set HALL)"
for v in hosts cdus duration kill_at restart_at; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || die "$v=\"${!v}\" is not a number"
done
((kill_at < restart_at && restart_at < duration)) || die "need KILL_AT < RESTART_AT < DURATION"
command -v curl >/dev/null || die "curl is needed"
command -v jq >/dev/null || die "jq is needed"
if ((witness_node > 0)); then
  command -v mosquitto_sub >/dev/null || die "mosquitto_sub is needed for the witness (or WITNESS_NODE=0)"
  command -v python3 >/dev/null || die "python3 is needed to read the witness's frames (or WITNESS_NODE=0)"
fi

mkdir -p "$out"
cdir="$out/cluster"
[[ ! -e "$cdir/cluster.env" ]] || die "$out was used already: give a fresh OUT"
fleet_pid=""
witness_pid=""
sampler_pid=""

cleanup() {
  [[ -z "$sampler_pid" ]] || kill "$sampler_pid" 2>/dev/null || true
  [[ -z "$fleet_pid" ]] || kill "$fleet_pid" 2>/dev/null || true
  [[ -z "$witness_pid" ]] || kill "$witness_pid" 2>/dev/null || true
  if [[ -f "$cdir/cluster.env" ]]; then "$cluster" stop "$cdir" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

say() { echo "[$(date +%T)] $*" | tee -a "$out/timeline.txt"; }

"$cluster" start "$cdir" >"$out/cluster-start.txt"
# shellcheck disable=SC1091
source "$cdir/cluster.env"
# shellcheck disable=SC2153
read -r -a mqtt_ports <<<"$MQTT_PORTS"
# shellcheck disable=SC2153
read -r -a http_ports <<<"$HTTP_PORTS"
broker_args=()
for p in "${mqtt_ports[@]}"; do broker_args+=(--broker "127.0.0.1:$p"); done
say "cluster up: mqtt ${mqtt_ports[*]}, monitoring ${http_ports[*]}"

# Each running node's view of $MQTT_msgs and its consumers: the stream's
# leader, messages and sequence range, each replica's lag, and per
# consumer its leader, delivered and acknowledged stream sequences and
# what is in flight or waiting.
snapshot() { # LABEL
  local label="$1" f="$out/state-$1.txt"
  echo "== $label $(date +%T)" >"$f"
  for n in 1 2 3; do
    local port="${http_ports[$((n - 1))]}" j="$out/jsz-$label-n$n.json"
    if ! curl -sf -m 5 "http://127.0.0.1:$port/jsz?streams=true&consumers=true&config=true" >"$j"; then
      echo "n$n: down or not answering" >>"$f"
      rm -f "$j"
      continue
    fi
    curl -sf -m 5 "http://127.0.0.1:$port/varz" >"$out/varz-$label-n$n.json" || true
    curl -sf -m 5 "http://127.0.0.1:$port/connz" >"$out/connz-$label-n$n.json" || true
    jq -r --arg n "n$n" '
      .account_details[]?.stream_detail[]?
      | select(.name | startswith("$MQTT_"))
      | "\($n) stream \(.name) leader=\(.cluster.leader // "-") msgs=\(.state.messages) first=\(.state.first_seq) last=\(.state.last_seq) deleted=\(.state.num_deleted // 0) consumers=\(.state.consumer_count) replicas=\([.cluster.replicas[]? | "\(.name):current=\(.current),lag=\(.lag // 0)"] | join(" "))",
        (.consumer_detail[]? | "\($n)   consumer \(.name) filter=\(.config.filter_subject // "-") R=\(.config.num_replicas // 0) mem=\(.config.mem_storage // false) leader=\(.cluster.leader // "-") delivered=\(.delivered.stream_seq)/\(.delivered.consumer_seq) ack_floor=\(.ack_floor.stream_seq) ack_pending=\(.num_ack_pending) redelivered=\(.num_redelivered) pending=\(.num_pending)")
    ' "$j" >>"$f" 2>/dev/null || echo "n$n: unreadable /jsz" >>"$f"
  done
  grep -E "stream \\\$MQTT_msgs|filter=\\\$MQTT\.msgs\.dc\.v2\.[^.]+\.>" "$f" | sed "s/^/  /" | tee -a "$out/timeline.txt" || true
}

if ((witness_node > 0)); then
  # A QoS 1 subscriber of its own on another node, persistent session:
  # every host's event frame, topic and hex payload.
  mosquitto_sub -h 127.0.0.1 -p "${mqtt_ports[$((witness_node - 1))]}" -V mqttv311 \
    -i "lw-witness-$$" -c -q 1 -k 10 -t 'dc/v2/+/host/+/event' -F '%t %x' \
    >"$out/witness.raw" 2>"$out/witness.err" &
  witness_pid=$!
  say "witness on node $witness_node (pid $witness_pid)"
fi

# The consumers of $MQTT_msgs every 2 s, as each running node sees them.
sample_consumers() {
  while true; do
    for n in 1 2 3; do
      curl -sf -m 2 "http://127.0.0.1:${http_ports[$((n - 1))]}/jsz?streams=true&consumers=true&config=true" 2>/dev/null |
        jq -r --arg n "n$n" --arg t "$(date +%T)" '
          .account_details[]?.stream_detail[]? | select(.name == "$MQTT_msgs")
          | "\($t) \($n) last=\(.state.last_seq) msgs=\(.state.messages) leader=\(.cluster.leader // "-") "
            + ([.consumer_detail[]? | "\(.name[0:12])[\(.config.filter_subject // "-" | sub("^\\$MQTT\\.msgs\\.dc\\.v2\\."; ""))]@\(.cluster.leader // "-")=\(.delivered.stream_seq)/\(.delivered.consumer_seq)"] | join(" "))
        ' 2>/dev/null || true
    done
    sleep 2
  done >>"$out/consumers.txt"
}
sample_consumers &
sampler_pid=$!

RUST_LOG="${RUST_LOG:-warn,loopwarden_hall::fleet=info}" \
  "$hall" fleet --hosts "$hosts" --cdus "$cdus" --duration "$duration" \
  "${broker_args[@]}" --observer-broker "127.0.0.1:${mqtt_ports[$((observer_node - 1))]}" \
  --json >"$out/report.json" 2>"$out/fleet.log" &
fleet_pid=$!
say "fleet: $hosts hosts, $cdus CDUs, $duration s (pid $fleet_pid); node $kill_node killed at $kill_at s, started at $restart_at s"

# The halls' clock starts when every agent is connected.
until grep -q "every agent connected" "$out/fleet.log" 2>/dev/null; do
  kill -0 "$fleet_pid" 2>/dev/null || {
    tail -n 20 "$out/fleet.log" >&2
    die "the fleet ended before its agents connected"
  }
  sleep 0.2
done
t0=$SECONDS
say "every agent connected: $(grep -o 'every agent connected in [0-9.]* s' "$out/fleet.log")"

at() { # SECONDS into the halls' run
  local wait=$(($1 - (SECONDS - t0)))
  ((wait <= 0)) || sleep "$wait"
}

at $((kill_at - 3))
snapshot before-kill
at "$kill_at"
"$cluster" kill-node "$kill_node" "$cdir"
say "node $kill_node killed at $((SECONDS - t0)) s"
at $((kill_at + 15))
snapshot after-kill
at "$restart_at"
"$cluster" start-node "$kill_node" "$cdir" >/dev/null
say "node $kill_node started at $((SECONDS - t0)) s"
NATS_READY_TIMEOUT=90 "$cluster" status "$cdir" >/dev/null || say "cluster not ready after the restart"
say "cluster ready again at $((SECONDS - t0)) s"
snapshot after-restart
at $((duration - 2))
snapshot end-of-halls

# The fleet waits for late deliveries (up to 35 s more for an
# acknowledged event still missing), then reports.
wait "$fleet_pid" || say "fleet exited with $?"
fleet_pid=""
say "fleet done"
if [[ -n "$witness_pid" ]]; then
  sleep 2
  kill "$witness_pid" 2>/dev/null || true
  wait "$witness_pid" 2>/dev/null || true
  witness_pid=""
  # Topic and frame -> "HOST SEQ": the frame header is postcard after
  # three bytes: role (varint), id (varint length, bytes), seq (varint).
  python3 - "$out/witness.raw" >"$out/witness.txt" <<'EOF'
import sys
def varint(b, i):
    v = s = 0
    while True:
        x = b[i]; i += 1; v |= (x & 0x7f) << s; s += 7
        if x < 0x80:
            return v, i
for line in open(sys.argv[1]):
    try:
        topic, hexed = line.split()
        b = bytes.fromhex(hexed)
        _, i = varint(b, 3)
        n, i = varint(b, i)
        host = b[i:i + n].decode(); i += n
        seq, _ = varint(b, i)
        print(host, seq)
    except (ValueError, IndexError):
        pass
EOF
fi

{
  echo "shape: $hosts hosts, $cdus CDUs, $duration s; node $kill_node SIGKILLed at $kill_at s, started at $restart_at s; observer on node $observer_node"
  echo "server: $("${NATS_SERVER:-nats-server}" --version 2>/dev/null || echo '?')"
  jq -r '"events acked \(.events_acked), not delivered by the broker \(.qos1_events_lost), repaired \(.events_repaired), lost after repair \(.events_lost_after_repair) (resend requests \(.resend_requests), frames resent \(.resent_received)); sequence gaps \(.seq_gaps); frames published \(.frames_published), received \(.frames_received), lost \(.frames_lost); QoS 1 not received \(.qos1_not_received); duplicates \(.duplicates); connections lost (agents, controllers, observer) \(.connection_errors)"' "$out/report.json" 2>/dev/null || echo "no report (see fleet.log)"
  jq -r 'def said: if length == 0 then "none" else join(" ") end; "ended before told to stop: agents \(.agents_ended_early | said), controllers \(.controllers_ended_early | said)"' "$out/report.json" 2>/dev/null || true
  missing="$(grep -o "host [^ ]*'s event, frame [0-9]*" "$out/fleet.log" | sed "s/host \([^ ]*\)'s event, frame /\1 /" || true)"
  if [[ -n "$missing" ]]; then
    echo "acknowledged, never received by the observer nor resent (first 20):"
    while read -r h s; do
      if [[ -f "$out/witness.txt" ]]; then
        if grep -qx "$h $s" "$out/witness.txt"; then w="received by the witness"; else w="NOT received by the witness either"; fi
      else
        w="no witness"
      fi
      echo "  $h frame $s: $w"
    done <<<"$missing"
  fi
  # The observer's consumer (filter: the whole site, so its consumer
  # sequence follows the stream sequence one for one until a message is
  # delivered again) on its leader, from the 2 s samples: the largest
  # stream sequence less consumer sequence, the messages it stepped over.
  awk '{
      for (i = 3; i <= NF; i++) if ($i ~ /\[fleet-[0-9]+\.>\]@/) {
        split($i, a, "@"); split(a[2], b, "="); split(b[2], c, "/")
        if (b[1] != $2) continue
        d = c[1] - c[2]
        if (d > m) { m = d; at = $1 }
        if (b[1] != leader) { leaders = leaders " " b[1] " from " $1; leader = b[1] }
      }
    } END {
      printf "observer consumer: stepped over at most %d stream messages%s; leaders:%s\n", m, (m > 0 ? " (first at " at ")" : ""), leaders
    }' "$out/consumers.txt"
  for j in "$out"/jsz-before-kill-n*.json; do
    [[ -f "$j" ]] || continue
    jq -r '.account_details[]?.stream_detail[]? | select(.name == "$MQTT_msgs")
      | "$MQTT_msgs: retention \(.config.retention), replicas \(.config.num_replicas), max_age \(.config.max_age / 1000000000) s"' "$j" 2>/dev/null && break
  done
  if [[ -f "$out/witness.txt" ]]; then
    echo "witness: $(sort -u "$out/witness.txt" | wc -l) distinct events, $(wc -l <"$out/witness.raw") received, $(grep -c . "$out/witness.err" || true) lines of errors"
  fi
  for n in 1 2 3; do
    echo "n$n.log: $(grep -ciE '\[(ERR|WRN)\]' "$cdir/n$n.log" || true) warnings/errors; $(grep -ciE 'lost|reset|catchup|stepping down|became leader|not current' "$cdir/n$n.log" || true) lines on leaders, catch-up, resets"
  done
} | tee "$out/summary.txt"
echo "out: $out"
