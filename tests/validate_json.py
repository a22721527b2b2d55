#!/usr/bin/env python3
"""Validate JSON frames against the committed JSON Schemas with a validator
written elsewhere (the `jsonschema` package).

Usage: validate_json.py SCHEMA_DIR FRAMES_FILE
FRAMES_FILE holds one `<kind>\t<json>` per line. Exit 1 on the first problem,
saying which frame and why. Every schema is also checked against the
metaschema, and a damaged copy of every frame must be refused, so a
validator that accepts everything cannot pass.
"""
import copy
import json
import sys

import jsonschema


def damaged(frame):
    """Copies of `frame` that its schema must refuse."""
    out = []
    for field in ("seq", "sender", "body"):
        bad = copy.deepcopy(frame)
        del bad[field]
        out.append((f"without {field}", bad))
    bad = copy.deepcopy(frame)
    bad["kind"] = "not_a_kind"
    out.append(("with a wrong kind", bad))
    bad = copy.deepcopy(frame)
    bad["protocol"] = "3.0"
    out.append(("with protocol 3.0", bad))
    bad = copy.deepcopy(frame)
    bad["sender"]["id"] = "a/b"
    out.append(("with a sender id holding '/'", bad))
    return out


def main():
    schema_dir, frames_file = sys.argv[1], sys.argv[2]
    count = 0
    with open(frames_file, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            kind, text = line.rstrip("\n").split("\t", 1)
            with open(f"{schema_dir}/{kind}.json", encoding="utf-8") as s:
                schema = json.load(s)
            jsonschema.Draft202012Validator.check_schema(schema)
            validator = jsonschema.Draft202012Validator(schema)
            frame = json.loads(text)
            errors = sorted(validator.iter_errors(frame), key=str)
            if errors:
                print(f"line {n}: {kind} frame invalid: {errors[0].message} at {list(errors[0].path)}")
                return 1
            for what, bad in damaged(frame):
                if validator.is_valid(bad):
                    print(f"line {n}: {kind} schema accepts a frame {what}")
                    return 1
            count += 1
    print(f"{count} frames valid against their schemas")
    return 0 if count else 1


if __name__ == "__main__":
    sys.exit(main())
