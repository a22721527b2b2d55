#!/usr/bin/env python3
"""The figures and checks of firmware/test-qemu.sh, from what the run left.

Reads the simulated CDU's record (`loopwarden-hall cdu --record`: every
write, fault and fallback with its wall time), the host's replay of the
firmware's trace (`cooling-ctrl replay-trace`), the CDU's state as the bus
carried it, the script's own marks (when it killed and started things, in
seconds since the CDU started serving) and the firmware's ELF. Prints one
JSON object on its last line; exits 1 when a check fails.
"""
import argparse
import json
import struct
import sys

LIMITS = {  # issue 34's "Done when"
    "leak_isolated_ms": 2000,
    "pump_switchover_ms": 10000,
    "insn_per_step_max": 250000,
    "stack_peak_bytes": 16384,
    "transactions_out_of_time": 0,
}
LEAK_RACK = 2
SHF_ALLOC, SHT_NOBITS = 0x2, 8


def flash_bytes(elf):
    """Bytes the image takes in the board's code memory: every section
    that is loaded and has contents (.vector_table, .text, .rodata, .data)."""
    with open(elf, "rb") as f:
        b = f.read()
    if b[:4] != b"\x7fELF" or b[4] != 1:
        sys.exit(f"{elf}: not a 32-bit ELF")
    shoff, = struct.unpack_from("<I", b, 0x20)
    shentsize, shnum = struct.unpack_from("<HH", b, 0x2E)
    total = 0
    for i in range(shnum):
        _, sh_type, flags, _, _, size = struct.unpack_from("<IIIIII", b, shoff + i * shentsize)
        if flags & SHF_ALLOC and sh_type != SHT_NOBITS:
            total += size
    return total


def first(facts, after_ms, pred):
    return next((f for f in facts if f["wall_ms"] >= after_ms and pred(f)), None)


def ok_write(reg, pred=lambda v: True):
    return lambda f: (f["kind"] == "write" and f["register"] == reg and f["ok"]
                      and pred(int(f["value"])))


def fault(facts, kind, target):
    return next((f for f in facts if f["kind"] == "fault_begins"
                 and f["fault"] == kind and str(f.get("target")) == target), None)


def heartbeat_kept(facts, lo_ms, hi_ms):
    """Heartbeat writes kept changing through [lo, hi] (no gap over 2.5 s),
    and the CDU never fell back in it."""
    beats = [f for f in facts if ok_write("heartbeat")(f) and lo_ms <= f["wall_ms"] <= hi_ms]
    fell = [f for f in facts if f["kind"] == "fallback" and f["on"] and lo_ms <= f["wall_ms"] <= hi_ms]
    times = [lo_ms] + [f["wall_ms"] for f in beats] + [hi_ms]
    gap = max(b - a for a, b in zip(times, times[1:]))
    values = [f["value"] for f in beats]
    changing = all(a != b for a, b in zip(values, values[1:]))
    return bool(beats) and not fell and gap <= 2500 and changing, gap


def main():
    p = argparse.ArgumentParser()
    for a in ("--elf", "--record", "--replay", "--state", "--t0", "--marks", "--console"):
        p.add_argument(a, required=True)
    a = p.parse_args()
    facts = [json.loads(line) for line in open(a.record) if line.strip()]
    replay = json.load(open(a.replay))
    marks = json.loads(a.marks)
    failed = []

    leak = fault(facts, "leak", str(LEAK_RACK))
    shut = leak and first(facts, leak["wall_ms"],
                          ok_write("valves_open", lambda v: not v & (1 << LEAK_RACK)))
    leak_ms = shut["wall_ms"] - leak["wall_ms"] if shut else None
    trip = fault(facts, "pump_trip", "A")
    other = trip and first(facts, trip["wall_ms"], lambda f: (
        ok_write("pumps_run", lambda v: v & 0b10)(f) or ok_write("lead_pump", lambda v: v == 1)(f)))
    switch_ms = other["wall_ms"] - trip["wall_ms"] if other else None

    killed_ms, back_ms = marks["gateway_killed_s"] * 1000, marks["gateway_started_s"] * 1000
    kept, gap = heartbeat_kept(facts, killed_ms, back_ms)
    gateway_killed_safe = bool(
        leak and shut and killed_ms < leak["wall_ms"] and shut["wall_ms"] < back_ms
        and leak_ms <= LIMITS["leak_isolated_ms"] and kept)

    mcu_ms = marks["mcu_killed_s"] * 1000
    fell = first(facts, mcu_ms, lambda f: f["kind"] == "fallback" and f["on"])
    silent = None
    for line in open(a.state):
        stamp, _, payload = line.partition(" ")
        if "controller-silent" in payload:
            silent = (float(stamp) - float(a.t0)) * 1000 - mcu_ms
            break

    # The hall the firmware's core ran: its console's "figures:" line
    # ("figures: SOURCE: HALL").
    said = next((line for line in open(a.console, errors="replace")
                 if line.startswith("figures: ")), None)
    hall = said.rsplit(": ", 1)[-1].strip() if said else None
    # Transactions the step's budget left unsent or cut short: none, with
    # a CDU that answers in tens of milliseconds.
    out_of_time = sum(1 for line in open(a.console, errors="replace")
                      if "the step's time ran out" in line)
    out = {
        "figures": hall,
        "steps": replay["steps"],
        "insn_per_step_median": replay["insn_per_step_median"],
        "insn_per_step_max": replay["insn_per_step_max"],
        "stack_peak_bytes": replay["stack_peak_bytes"],
        "flash_bytes": flash_bytes(a.elf),
        "leak_isolated_ms": leak_ms,
        "pump_switchover_ms": switch_ms,
        "digest_matches_host": bool(replay["all_match"]),
        "gateway_killed_safe": gateway_killed_safe,
        "heartbeat_gap_while_gateway_dead_ms": gap,
        "digests_compared": replay["compared"],
        "trace_frames_dropped": sum(replay["frames_dropped"].values()),
        "mcu_killed_cdu_fallback_ms": round(fell["wall_ms"] - mcu_ms) if fell else None,
        "mcu_killed_bus_told_ms": round(silent) if silent is not None else None,
        "transactions_out_of_time": out_of_time,
    }
    for k, limit in LIMITS.items():
        if out[k] is None or out[k] > limit:
            failed.append(f"{k} = {out[k]} (limit {limit})")
    for k in ("digest_matches_host", "gateway_killed_safe"):
        if not out[k]:
            failed.append(f"{k} is false")
    if out["mcu_killed_cdu_fallback_ms"] is None:
        failed.append("the CDU never fell back after the board was killed")
    if out["mcu_killed_bus_told_ms"] is None:
        failed.append("the gateway never said controller-silent on the bus")
    if hall is None or "was not set" in said:
        failed.append("the firmware's core did not run the figures built in (its console's figures line)")
    if not out["steps"]:
        failed.append("the trace holds no step")
    for f in failed:
        print(f"test-qemu: FAILED: {f}", file=sys.stderr)
    if failed:
        print(f"test-qemu: the firmware's console:\n{open(a.console, errors='replace').read()[-3000:]}",
              file=sys.stderr)
    print(json.dumps(out))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
