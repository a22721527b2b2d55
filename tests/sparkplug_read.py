"""A Sparkplug host application for the whole-system test, built on a
decoder nobody here wrote (pysparkplug): it subscribes to spBv1.0/#,
decodes every message and prints it as one line of JSON; a line
`rebirth GROUP EDGE` on standard input sends that edge node an NCMD
`Node Control/Rebirth`, encoded by pysparkplug.

usage: python3 sparkplug_read.py PORT
"""

import json
import sys
import threading

import paho.mqtt.client as mqtt
import pysparkplug as spb
from pysparkplug import _protobuf as pb

births = {}
lock = threading.Lock()


def say(obj):
    with lock:
        print(json.dumps(obj, sort_keys=True), flush=True)


def unit_of(raw_metric):
    props = raw_metric.properties
    for key, value in zip(props.keys, props.values):
        if key == "engUnit":
            return value.string_value
    return None


def describe(msg):
    topic = spb.Topic.from_str(msg.topic)
    kind = str(topic.message_type)
    key = (topic.group_id, topic.edge_node_id, topic.device_id)
    raw = pb.Payload.FromString(msg.payload)
    if kind in ("NDEATH", "DDEATH"):
        # The will is held by the broker from connect time: no births needed.
        birth = None
    else:
        birth = births.get(key)
    message = spb.Message.from_mqtt_message(msg, birth=birth)
    payload = message.payload
    if kind in ("NBIRTH", "DBIRTH"):
        births[key] = payload
        if kind == "NBIRTH":
            # A new session: its devices must be born again.
            for k in [k for k in births if k[:2] == key[:2] and k[2] is not None]:
                del births[k]
    if kind == "NDEATH":
        metrics = [payload.bd_seq_metric]
    else:
        metrics = list(getattr(payload, "metrics", ()))
    units = {m.name: unit_of(m) for m in raw.metrics if m.name}
    out = {
        "type": kind,
        "group": topic.group_id,
        "edge": topic.edge_node_id,
        "device": topic.device_id,
        "qos": msg.qos,
        "retain": bool(msg.retain),
        "has_seq": raw.HasField("seq"),
        "seq": raw.seq if raw.HasField("seq") else None,
        "timestamp": raw.timestamp if raw.HasField("timestamp") else None,
        "metrics": {},
    }
    for m in metrics:
        value = m.value
        if isinstance(value, bytes):
            value = value.hex()
        out["metrics"][m.name] = {
            "datatype": m.datatype.name,
            "value": None if m.is_null else value,
            "is_null": bool(m.is_null),
            "timestamp": m.timestamp,
            "unit": units.get(m.name),
        }
    return out


def on_message(client, userdata, msg):
    try:
        say(describe(msg))
    except Exception as e:  # the test fails on this line, with the reason
        say({"type": "ERROR", "topic": msg.topic, "error": repr(e)})


def on_subscribe(client, userdata, mid, reason_codes, properties):
    say({"type": "READY"})


def on_connect(client, userdata, flags, reason_code, properties):
    client.subscribe("spBv1.0/#", qos=1)


def commands(client):
    for line in sys.stdin:
        words = line.split()
        if len(words) == 3 and words[0] == "rebirth":
            rebirth = spb.Metric(
                timestamp=spb.get_current_timestamp(),
                name="Node Control/Rebirth",
                datatype=spb.DataType.BOOLEAN,
                value=True,
            )
            ncmd = spb.NCmd(timestamp=spb.get_current_timestamp(), metrics=(rebirth,))
            topic = f"spBv1.0/{words[1]}/NCMD/{words[2]}"
            client.publish(topic, ncmd.encode(), qos=0)
            say({"type": "SENT", "topic": topic})


def main():
    port = int(sys.argv[1])
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="sparkplug-reader")
    client.on_connect = on_connect
    client.on_subscribe = on_subscribe
    client.on_message = on_message
    client.connect("127.0.0.1", port, keepalive=30)
    threading.Thread(target=commands, args=(client,), daemon=True).start()
    client.loop_forever()


if __name__ == "__main__":
    main()
