#!/usr/bin/env python3
"""Example mlsched exec model: JSON lines on stdin -> JSON lines on stdout.

Once loaded, it prints {"ready": true}; until then the worker does not
announce the model (docs/models.md, "exec protocol").

Request:  {"id": "...", "type": "...", "payload": ...}
Response: {"id": "...", "output": ...}  or  {"id": "...", "error": "...", "task_error": true|false}

It echoes the payload. Payload objects may ask for test behaviours:
  {"fail": "msg"}  -> a model error        {"bad": "msg"} -> a task error
  {"exit": 3}      -> the process exits with that status (tests restarts)
  {"big": n}       -> an output of n bytes (tests the line bound)
"""
import json
import sys


def answer(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    answer({"ready": True})
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
        except ValueError as e:
            print("echo_model: bad request line: %s" % e, file=sys.stderr, flush=True)
            continue
        rid = req.get("id", "")
        payload = req.get("payload")
        if isinstance(payload, dict):
            if "exit" in payload:
                print("echo_model: exiting as asked", file=sys.stderr, flush=True)
                sys.exit(int(payload["exit"]))
            if "fail" in payload:
                answer({"id": rid, "error": str(payload["fail"]), "task_error": False})
                continue
            if "big" in payload:
                answer({"id": rid, "output": "x" * int(payload["big"])})
                continue
            if "bad" in payload:
                answer({"id": rid, "error": str(payload["bad"]), "task_error": True})
                continue
        answer({"id": rid, "output": payload})


if __name__ == "__main__":
    main()
