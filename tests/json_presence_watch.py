#!/usr/bin/env python3
"""A facility reader of the JSON tree, as a paho-mqtt client (1.x or 2.x).

Run by the agents' JSON presence tests: it subscribes (QoS 1) to the
given JSON `online` topics on a broker and prints one JSON line per
message, as soon as it arrives:

  {"subscribed": true}                        once the broker answered
  {"topic": "dc/v2/s/json/host/h01/online", "retained": false,
   "online": true, "seq": 12, "started": 1795867200000}

It stops when its standard input closes (or when it is killed).
"""

import argparse
import json
import sys
import threading

import paho.mqtt.client as mqtt


def new_client(client_id):
    """A client of either paho API generation."""
    if hasattr(mqtt, "CallbackAPIVersion"):
        return mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
    return mqtt.Client(client_id=client_id)


def say(line):
    print(json.dumps(line), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("topics", nargs="+", help="JSON online topics to watch")
    args = ap.parse_args()

    c = new_client(f"json-presence-watch-{args.port}")

    def on_connect(client, _userdata, *_rest):
        client.subscribe([(t, 1) for t in args.topics])

    def on_subscribe(_client, _userdata, *_rest):
        say({"subscribed": True})

    def on_message(_client, _userdata, msg):
        try:
            frame = json.loads(msg.payload)
            body = frame["body"]
            line = {
                "topic": msg.topic,
                "retained": bool(msg.retain),
                "online": body["online"],
                "seq": frame["seq"],
                "started": body["started"],
            }
        except (ValueError, KeyError, TypeError) as e:
            line = {"topic": msg.topic, "error": f"not a JSON online frame: {e}"}
        say(line)

    c.on_connect = on_connect
    c.on_subscribe = on_subscribe
    c.on_message = on_message
    c.connect(args.host, args.port, keepalive=30)
    c.loop_start()
    # Until the test closes our standard input.
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    done.wait()
    c.loop_stop()
    c.disconnect()


if __name__ == "__main__":
    main()
