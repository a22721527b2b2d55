#!/usr/bin/env python3
"""An attacker on a Loopwarden site's broker, as a paho-mqtt 2.x client.

Run by tests/tests/bus_acl.rs against a mosquitto started with the
configuration of `lwbus pki init`. It tries to connect without a client
certificate and with a certificate from another CA, then, with host h01's
own certificate, publishes where a host must not (another host's health,
the CDU's health, another host's commands) while facility reader bms1
listens on the whole site. A last publish by h01 on its own telemetry is
the marker: once the reader has it, everything published before it had its
chance to arrive.

Prints one JSON line:
  {"no_cert": {"connected": false, "error": "..."},
   "other_ca": {"connected": false, "error": "..."},
   "h01_connected": true, "reader_subscribed": true,
   "marker_seen": true, "seen": ["dc/v2/lab/host/h01/telemetry", ...]}
"""

import argparse
import json
import os
import ssl
import threading
import time

import paho.mqtt.client as mqtt

HOST = "127.0.0.1"
WAIT_S = 10.0


def new_client(name, ca, cert=None, key=None):
    client_id = f"attacker-{name}-{os.getpid()}"
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
    c.tls_set(ca_certs=ca, certfile=cert, keyfile=key)
    return c


def try_connect(port, ca, cert=None, key=None, name="probe"):
    """Whether a connection gets a successful CONNACK, and why not."""
    result = {"connected": False, "error": None}
    done = threading.Event()
    c = new_client(name, ca, cert, key)

    def on_connect(_c, _u, _flags, reason, _props):
        result["connected"] = not reason.is_failure
        if reason.is_failure:
            result["error"] = f"CONNACK {reason}"
        done.set()

    c.on_connect = on_connect
    try:
        c.connect(HOST, port, keepalive=10)
        deadline = time.monotonic() + WAIT_S
        while not done.is_set() and time.monotonic() < deadline:
            rc = c.loop(timeout=0.1)
            if rc != mqtt.MQTT_ERR_SUCCESS:
                result["error"] = f"connection lost: {mqtt.error_string(rc)}"
                break
    except (ssl.SSLError, OSError) as e:
        result["error"] = f"{type(e).__name__}: {e}"
    if not done.is_set() and result["error"] is None:
        result["error"] = "no CONNACK"
    c.disconnect()
    return result


def started(c, port, connected):
    def on_connect(_c, _u, _flags, reason, _props):
        if not reason.is_failure:
            connected.set()

    c.on_connect = on_connect
    c.connect(HOST, port, keepalive=10)
    c.loop_start()
    return connected.wait(WAIT_S)


def denied_publishes(port, site_dir, site):
    """h01 publishes where it may not; bms1 reports what it received."""
    root = f"dc/v2/{site}"
    pki = lambda name: (os.path.join(site_dir, f"{name}.crt"), os.path.join(site_dir, f"{name}.key"))
    ca = os.path.join(site_dir, "ca.crt")
    marker = f"{root}/host/h01/telemetry"
    seen, got_marker, subscribed = [], threading.Event(), threading.Event()
    reader = new_client("bms1", ca, *pki("bms1"))

    def on_message(_c, _u, msg):
        seen.append(msg.topic)
        if msg.topic == marker and msg.payload == b"marker":
            got_marker.set()

    reader.on_message = on_message
    reader.on_subscribe = lambda *_args: subscribed.set()
    out = {"reader_subscribed": False, "h01_connected": False, "marker_seen": False}
    if not started(reader, port, threading.Event()):
        return out
    reader.subscribe(f"{root}/#", qos=1)
    out["reader_subscribed"] = subscribed.wait(WAIT_S)
    h01 = new_client("h01", ca, *pki("h01"))
    out["h01_connected"] = started(h01, port, threading.Event())
    if out["h01_connected"]:
        for topic in [f"{root}/host/h02/health", f"{root}/cdu/cdu1/health", f"{root}/host/h02/cmd"]:
            h01.publish(topic, b"forged", qos=1).wait_for_publish(WAIT_S)
        h01.publish(marker, b"marker", qos=1).wait_for_publish(WAIT_S)
        out["marker_seen"] = got_marker.wait(WAIT_S)
    for c in (h01, reader):
        c.disconnect()
        c.loop_stop()
    out["seen"] = seen
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--site", default="lab")
    p.add_argument("--dir", required=True, help="the broker's site PKI (lwbus pki init)")
    p.add_argument("--other-dir", required=True, help="another site's PKI (another CA)")
    a = p.parse_args()
    ca = os.path.join(a.dir, "ca.crt")
    other = lambda f: os.path.join(a.other_dir, f)
    result = {
        "no_cert": try_connect(a.port, ca, name="nocert"),
        "other_ca": try_connect(a.port, ca, other("h01.crt"), other("h01.key"), name="otherca"),
    }
    result.update(denied_publishes(a.port, a.dir, a.site))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
