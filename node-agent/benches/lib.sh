# shellcheck shell=bash
# What the node agent's cost benchmarks (metrics_cost.sh, tls_cost.sh)
# do alike, sourced by each, not run on its own: the run's temporary
# folder and its cleanup, free loopback ports, a process's CPU time, the
# waits of a run, and the table of medians at the end.
#
# Glossary:
#   tick     a unit of utime and stime in /proc/PID/stat ($tick a second).
#   mode     one of the set-ups a benchmark compares (`off`, `tls`, ...).
#   results  one line a run: its mode, its number, then its figures, NA
#            where a figure was not taken.

# Exits unless every command named is on the PATH.
need() {
  local c
  for c in "$@"; do
    command -v "$c" >/dev/null || { echo "$c is needed" >&2; exit 1; }
  done
}

# Makes the run's temporary folder $dir; at exit every process whose pid
# is in $pids is stopped and the folder removed.
bench_dir() {
  dir=$(mktemp -d)
  pids=()
  trap cleanup EXIT
}
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# shellcheck disable=SC2034 # read by the scripts that source this
tick=$(getconf CLK_TCK)
# utime + stime of a process, ticks.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Sleeps until $2 seconds after the moment $1 ($EPOCHREALTIME).
sleep_until() {
  python3 -c "import time; time.sleep(max(0.0, $1 + $2 - time.time()))"
}

# The machine and its load, the first line of the results.
machine() {
  echo "machine: $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'), $(uname -sr); load $(cut -d' ' -f1-3 /proc/loadavg)"
}

# each_run RUNS "MODES": runs the benchmark's `one_run MODE RUN` RUNS
# times over MODES, the modes in turn, then says the load.
each_run() {
  local i m
  for i in $(seq "$1"); do
    # shellcheck disable=SC2086 # MODES is a list of words
    for m in $2; do one_run "$m" "$i"; done
  done
  echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
}

# medians RESULTS STEADY_S WIDTH DIGITS EMPTY "MODES" "NAME|COLUMN|UNIT"...
# The table at the end: for each figure NAME (column COLUMN of RESULTS,
# 0-based, in UNIT) a row, for each mode a cell of WIDTH characters, the
# median of its runs [min - max] with DIGITS decimals, or EMPTY where no
# run has the figure.
medians() {
  python3 - "$@" <<'PY'
import statistics, sys
results, steady, width, digits, empty, modes = sys.argv[1:7]
rows = [l.split() for l in open(results)]
steady, width, digits, modes = float(steady), int(width), int(digits), modes.split()
cols = [(name, int(c), unit) for name, c, unit in (a.split("|") for a in sys.argv[7:])]
print()
print(f"medians over the runs (CPU over {steady:.0f} s); [min - max]")
print(f"{'':26}" + "".join(f"{m:>{width}}" for m in modes))
for name, c, unit in cols:
    line = f"{name:26}"
    for m in modes:
        v = [float(r[c]) for r in rows if r[0] == m and r[c] != "NA"]
        cell = (f"{statistics.median(v):.{digits}f} [{min(v):.{digits}f} - {max(v):.{digits}f}]"
                if v else empty)
        line += f"{cell:>{width}}"
    print(line + f"  {unit}")
PY
}
