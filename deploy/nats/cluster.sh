#!/usr/bin/env bash
# A three-node NATS cluster with JetStream and MQTT on loopback, from one
# configuration (node.conf next to this script): for trials of the agents'
# broker failover and for the whole-system tests. A site runs one node per
# machine instead (docs/brokers.md).
#
#   cluster.sh start [DIR]         start nodes 1-3, wait until ready, print
#                                  the MQTT addresses
#   cluster.sh status [DIR]        wait until every running node is ready;
#                                  print each node and the MQTT addresses
#   cluster.sh stop [DIR]          stop every node (SIGTERM)
#   cluster.sh stop-node N [DIR]   stop node N (SIGTERM)
#   cluster.sh kill-node N [DIR]   kill node N (SIGKILL: a crash)
#   cluster.sh start-node N [DIR]  start node N again (same ports, same store)
#
# DIR holds each node's JetStream store (nN/), log (nN.log), pid (nN.pid)
# and the ports chosen at `start` (cluster.env). Default: $NATS_CLUSTER_DIR,
# else ${TMPDIR:-/tmp}/loopwarden-nats.
#
# Ports, read at `start` (later commands take them from DIR/cluster.env):
#   NATS_BASE_PORT (default 14200): node N takes BASE+N for NATS clients,
#   BASE+10+N for routes, BASE+20+N for MQTT, BASE+30+N for monitoring;
#   or each list outright, three ports each: NATS_CLIENT_PORTS,
#   NATS_CLUSTER_PORTS, NATS_MQTT_PORTS, NATS_HTTP_PORTS ("p1,p2,p3").
# NATS_SERVER: the server binary (default: nats-server on PATH, or
# /usr/sbin/nats-server). NATS_READY_TIMEOUT: seconds to wait for
# readiness (default 60).
#
# `start` creates the MQTT messages stream ($MQTT_msgs) itself before the
# first MQTT connection, with limits retention: a QoS 1 message stays
# NATS_MQTT_MSGS_MAX_AGE seconds (default 900) whether or not every
# subscriber has acknowledged it, instead of NATS's own interest
# retention, under which subscribers lost acknowledged messages across a
# node's death (docs/brokers.md 2.3). NATS_MQTT_MSGS_MAX_AGE=0 leaves the
# stream to NATS.
#
# The last line of `start` and `status` is `mqtt=HOST:PORT,HOST:PORT,...`,
# the value of the agents' `broker` setting.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
conf="$here/node.conf"
nodes=(1 2 3)

die() {
  echo "cluster.sh: $*" >&2
  exit 1
}

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

server_bin() {
  if [[ -n "${NATS_SERVER:-}" ]]; then
    echo "$NATS_SERVER"
  elif command -v nats-server >/dev/null; then
    command -v nats-server
  elif [[ -x /usr/sbin/nats-server ]]; then
    echo /usr/sbin/nats-server
  else
    die "nats-server not found (apt-get install nats-server, or set NATS_SERVER)"
  fi
}

# The three ports of one kind: the list given, or BASE+offset+1..3.
ports_of() { # LIST_VALUE OFFSET
  local list="$1" offset="$2" base="${NATS_BASE_PORT:-14200}"
  if [[ -n "$list" ]]; then
    IFS=', ' read -r -a p <<<"$list"
    [[ ${#p[@]} -eq 3 ]] || die "a port list needs three ports, got \"$list\""
    for x in "${p[@]}"; do
      if ! [[ "$x" =~ ^[0-9]+$ ]] || ((x < 1 || x > 65535)); then
        die "port \"$x\" in \"$list\" is not a number from 1 to 65535"
      fi
    done
    echo "${p[*]}"
  else
    if ! [[ "$base" =~ ^[0-9]+$ ]] || ((base < 1 || base + 33 > 65535)); then
      die "NATS_BASE_PORT=\"$base\" leaves no room for ports BASE+1..BASE+33"
    fi
    echo "$((base + offset + 1)) $((base + offset + 2)) $((base + offset + 3))"
  fi
}

load_env() {
  [[ -f "$dir/cluster.env" ]] || die "no cluster in $dir (no cluster.env): run \`cluster.sh start $dir\` first"
  # shellcheck disable=SC1091
  source "$dir/cluster.env"
  # shellcheck disable=SC2153 # set by cluster.env
  read -r -a client_ports <<<"$CLIENT_PORTS"
  # shellcheck disable=SC2153
  read -r -a cluster_ports <<<"$CLUSTER_PORTS"
  # shellcheck disable=SC2153
  read -r -a mqtt_ports <<<"$MQTT_PORTS"
  # shellcheck disable=SC2153
  read -r -a http_ports <<<"$HTTP_PORTS"
}

write_env() {
  mkdir -p "$dir"
  local c r m h
  c="$(ports_of "${NATS_CLIENT_PORTS:-}" 0)"
  r="$(ports_of "${NATS_CLUSTER_PORTS:-}" 10)"
  m="$(ports_of "${NATS_MQTT_PORTS:-}" 20)"
  h="$(ports_of "${NATS_HTTP_PORTS:-}" 30)"
  local all
  all="$(echo "$c $r $m $h" | tr ' ' '\n' | sort | uniq -d)"
  [[ -z "$all" ]] || die "port(s) given twice: ${all//$'\n'/ }"
  cat >"$dir/cluster.env" <<EOF
CLIENT_PORTS="$c"
CLUSTER_PORTS="$r"
MQTT_PORTS="$m"
HTTP_PORTS="$h"
EOF
}

# Whether process PID runs (a zombie, killed and not yet reaped, does not).
alive() { # PID
  kill -0 "$1" 2>/dev/null && [[ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]]
}

pid_of() { # N: the pid of node N when it runs
  local f="$dir/n$1.pid" pid
  [[ -f "$f" ]] || return 1
  pid="$(cat "$f")"
  alive "$pid" || return 1
  echo "$pid"
}

start_node() { # N
  local n="$1" i=$(($1 - 1))
  if pid_of "$n" >/dev/null; then
    echo "node $n already runs (pid $(pid_of "$n"))"
    return 0
  fi
  mkdir -p "$dir/n$n"
  NATS_NODE_NAME="n$n" \
    NATS_CLIENT_PORT="${client_ports[$i]}" \
    NATS_CLUSTER_PORT="${cluster_ports[$i]}" \
    NATS_MQTT_PORT="${mqtt_ports[$i]}" \
    NATS_HTTP_PORT="${http_ports[$i]}" \
    NATS_STORE_DIR="$dir/n$n" \
    NATS_ROUTE_1="nats-route://127.0.0.1:${cluster_ports[0]}" \
    NATS_ROUTE_2="nats-route://127.0.0.1:${cluster_ports[1]}" \
    NATS_ROUTE_3="nats-route://127.0.0.1:${cluster_ports[2]}" \
    setsid "$(server_bin)" -c "$conf" >>"$dir/n$n.log" 2>&1 </dev/null &
  echo $! >"$dir/n$n.pid"
}

stop_node() { # N SIGNAL
  local n="$1" sig="$2" pid
  pid="$(pid_of "$n")" || {
    rm -f "$dir/n$n.pid"
    return 0
  }
  kill "-$sig" "$pid" 2>/dev/null || true
  for _ in $(seq 100); do
    alive "$pid" || break
    sleep 0.1
  done
  ! alive "$pid" || die "node $n (pid $pid) still runs 10 s after SIG$sig"
  rm -f "$dir/n$n.pid"
}

# GET /healthz on the monitoring port answers ok (JetStream current).
healthy() { # HTTP_PORT
  timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && printf 'GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3 && cat <&3" \
    2>/dev/null | grep -q '"status": *"ok"'
}

# An MQTT 3.1.1 CONNECT (clean session, no client id) is answered with a
# CONNACK that accepts it: the node's MQTT streams are reachable.
mqtt_ready() { # MQTT_PORT
  local reply
  reply="$(timeout 6 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 \
      && printf '\x10\x0c\x00\x04MQTT\x04\x02\x00\x0a\x00\x00' >&3 \
      && head -c 4 <&3 | od -An -tx1" 2>/dev/null)" || return 1
  [[ "${reply//[[:space:]]/}" == "20020000" ]]
}

# Waits until every running node is healthy and takes MQTT connections.
wait_ready() {
  local limit="${NATS_READY_TIMEOUT:-60}" start=$SECONDS running=0
  for n in "${nodes[@]}"; do
    local i=$((n - 1))
    pid_of "$n" >/dev/null || continue
    running=$((running + 1))
    until healthy "${http_ports[$i]}" && mqtt_ready "${mqtt_ports[$i]}"; do
      if ! pid_of "$n" >/dev/null; then
        tail -n 20 "$dir/n$n.log" >&2 || true
        die "node $n exited (ports taken?); its log is $dir/n$n.log"
      fi
      ((SECONDS - start < limit)) || die "node $n not ready after ${limit} s (monitoring 127.0.0.1:${http_ports[$i]}, MQTT 127.0.0.1:${mqtt_ports[$i]}); its log is $dir/n$n.log"
      sleep 0.2
    done
  done
  ((running > 0)) || die "no node of the cluster in $dir runs"
}

# Creates $MQTT_msgs (QoS 1 messages) on a fresh cluster before any MQTT
# client connects: three replicas, file storage, limits retention for
# NATS_MQTT_MSGS_MAX_AGE seconds. NATS 2.9 takes an existing stream of
# that name as it is.
create_msgs_stream() {
  local age="${NATS_MQTT_MSGS_MAX_AGE:-900}" limit="${NATS_READY_TIMEOUT:-60}" start=$SECONDS reply
  [[ "$age" =~ ^[0-9]+$ ]] || die "NATS_MQTT_MSGS_MAX_AGE=\"$age\" is not a number of seconds"
  ((age > 0)) || return 0
  local body
  body="{\"name\":\"\$MQTT_msgs\",\"subjects\":[\"\$MQTT.msgs.>\"],\"retention\":\"limits\",\"max_age\":${age}000000000,\"storage\":\"file\",\"num_replicas\":3,\"discard\":\"old\",\"max_consumers\":-1,\"max_msgs\":-1,\"max_bytes\":-1,\"max_msg_size\":-1,\"max_msgs_per_subject\":-1,\"duplicate_window\":120000000000}"
  until healthy "${http_ports[0]}" && healthy "${http_ports[1]}" && healthy "${http_ports[2]}"; do
    ((SECONDS - start < limit)) || die "JetStream not ready after ${limit} s (see $dir/n1.log)"
    sleep 0.2
  done
  while true; do
    # shellcheck disable=SC2016
    reply="$(timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/$1 \
        && printf "CONNECT {\"verbose\":false}\r\nSUB _INBOX.lwcreate 1\r\nPUB \$JS.API.STREAM.CREATE.\$MQTT_msgs _INBOX.lwcreate %d\r\n%s\r\n" "${#2}" "$2" >&3 \
        && grep -m1 -a "stream_create_response" <&3' _ "${client_ports[0]}" "$body" 2>/dev/null)" || true
    if [[ "$reply" == *stream_create_response* && "$reply" != *'"error"'* ]]; then
      return 0
    fi
    ((SECONDS - start < limit)) || die "could not create \$MQTT_msgs: ${reply:-no answer}"
    sleep 0.5
  done
}

report() {
  local list=()
  for n in "${nodes[@]}"; do
    local i=$((n - 1))
    if pid=$(pid_of "$n"); then
      echo "node $n: up (pid $pid) mqtt 127.0.0.1:${mqtt_ports[$i]} nats 127.0.0.1:${client_ports[$i]} monitoring http://127.0.0.1:${http_ports[$i]}"
    else
      echo "node $n: down"
    fi
    list+=("127.0.0.1:${mqtt_ports[$i]}")
  done
  (
    IFS=,
    echo "mqtt=${list[*]}"
  )
}

node_arg() {
  [[ "${1:-}" =~ ^[123]$ ]] || die "a node is 1, 2 or 3, not \"${1:-}\""
}

cmd="${1:-}"
[[ -n "$cmd" ]] || usage
shift
case "$cmd" in
  stop-node | kill-node | start-node)
    node_arg "${1:-}"
    node="$1"
    shift
    ;;
esac
dir="${1:-${NATS_CLUSTER_DIR:-${TMPDIR:-/tmp}/loopwarden-nats}}"

case "$cmd" in
  start)
    server_bin >/dev/null
    for n in "${nodes[@]}"; do
      ! pid_of "$n" >/dev/null || die "node $n of $dir runs already (pid $(pid_of "$n")): stop it first"
    done
    write_env
    load_env
    for n in "${nodes[@]}"; do start_node "$n"; done
    create_msgs_stream
    wait_ready
    report
    ;;
  status)
    load_env
    wait_ready
    report
    ;;
  stop)
    load_env
    for n in "${nodes[@]}"; do stop_node "$n" TERM; done
    ;;
  stop-node)
    load_env
    stop_node "$node" TERM
    ;;
  kill-node)
    load_env
    stop_node "$node" KILL
    ;;
  start-node)
    load_env
    start_node "$node"
    ;;
  *) usage ;;
esac
