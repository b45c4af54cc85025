#!/usr/bin/env python3
"""Example mlsched exec model: JSON lines on stdin -> JSON lines on stdout.

Request:  {"id": "...", "type": "...", "payload": ...}
Response: {"id": "...", "output": ...}  or  {"id": "...", "error": "...", "task_error": true|false}

It echoes the payload. Payload objects may ask for test behaviours:
  {"fail": "msg"}  -> a model error        {"bad": "msg"} -> a task error
  {"exit": 3}      -> the process exits with that status (tests restarts)
"""
import json
import sys


def answer(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
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
            if "bad" in payload:
                answer({"id": rid, "error": str(payload["bad"]), "task_error": True})
                continue
        answer({"id": rid, "output": payload})


if __name__ == "__main__":
    main()
