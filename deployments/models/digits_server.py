#!/usr/bin/env python3
"""mlsched's digits model server: scikit-learn classifiers behind the Open
Inference Protocol v2 (the REST API of KServe, Triton and MLServer), or as
an mlsched exec model speaking JSON lines.

Models (task type "digits"), trained at start on scikit-learn's bundled
digits dataset (8x8 images, pixel values 0..16; nothing is downloaded):

  digits-logreg   logistic regression
  digits-forest   random forest
  digits-knn      k-nearest neighbours

They train on the images whose index is not a multiple of --holdout (4), so
the other quarter can be used to measure accuracy on images never seen.

OIP v2 (HTTP, standard library http.server):
  GET  /v2/health/live, /v2/health/ready
  GET  /v2/models/{name}[/versions/1], .../ready
  POST /v2/models/{name}[/versions/1]/infer
       input:  one FP32/FP64/INT tensor of shape [N, 64] (or [64]), e.g.
               {"inputs":[{"name":"pixels","shape":[1,64],"datatype":"FP32","data":[...]}]}
       output: "label" INT64 [N] and "probabilities" FP32 [N, 10]

exec (--exec, one model): prints {"ready": true, "batch": true} once
trained, then reads {"id", "payload"} lines on stdin and answers {"id",
"output"} or {"id", "error", "task_error"}; payload {"pixels": [64 numbers]}
or the 64 numbers; output {"label": n, "probabilities": [10 numbers]}. A
{"batch": [request, ...]} line is predicted in one call, each request
answered on its own line (a bad input fails alone).

Fault injection, to show routing around a failing model (both modes):
  --fail-rate R      answer R of requests with 500 (exec: a model error)
  --429-rate R       answer R of requests with 429 + Retry-After
  --retry-after S    the Retry-After seconds of those 429s (default 1)
  --faults-after N   inject faults only after N inference requests
  --unready-after N  after N inference requests, turn unready (health and
                     model ready answer 503, inference 503)
  --crash-after N    exec: exit after N requests (the worker restarts it)
  --latency-ms L     add L ms to every inference
  --model-fault NAME:KIND:N   (repeatable) one model only, after N of its
                     inference requests: KIND 500 (every request fails),
                     429 (every request answers 429 + Retry-After) or
                     unready (its ready endpoint and inference answer 503)

Needs Python 3 and scikit-learn (Debian: apt-get install python3-sklearn).
"""
import argparse
import json
import random
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 1 << 20
VERSION = "1"
FEATURES = 64
CLASSES = 10


def train(names, holdout, seed):
    """Returns {model name: fitted classifier}."""
    from sklearn.datasets import load_digits
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.neighbors import KNeighborsClassifier

    digits = load_digits()
    idx = [i for i in range(len(digits.target)) if i % holdout != 0]
    x, y = digits.data[idx], digits.target[idx]
    makers = {
        "logreg": lambda: LogisticRegression(max_iter=2000),
        "forest": lambda: RandomForestClassifier(n_estimators=60, random_state=seed),
        "knn": lambda: KNeighborsClassifier(n_neighbors=3),
    }
    models = {}
    for n in names:
        if n not in makers:
            raise SystemExit("unknown model %r (want %s)" % (n, ", ".join(makers)))
        models["digits-" + n] = makers[n]().fit(x, y)
    return models


class BadInput(Exception):
    """The request's input is wrong: a task error (HTTP 400)."""


def flatten(v, out):
    if isinstance(v, list):
        for e in v:
            flatten(e, out)
    elif isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadInput("tensor data must be numbers, got %s" % type(v).__name__)
    else:
        out.append(float(v))


def rows(data):
    flat = []
    flatten(data, flat)
    if not flat or len(flat) % FEATURES:
        raise BadInput("want N x 64 pixel values (8x8 images, 0..16), got %d values" % len(flat))
    for p in flat:
        if not 0 <= p <= 16:
            raise BadInput("pixel value %g is outside 0..16" % p)
    return [flat[i:i + FEATURES] for i in range(0, len(flat), FEATURES)]


def predict(clf, x):
    probs = clf.predict_proba(x)
    labels = [int(clf.classes_[p.argmax()]) for p in probs]
    return labels, [[round(float(v), 6) for v in p] for p in probs]


class Faults:
    """Counts inference requests and decides which fault, if any, to inject."""

    KINDS = {"500": "fail", "429": "throttle", "unready": "unready"}

    def __init__(self, a):
        self.a = a
        self.n = 0
        self.per_model = {}  # name -> requests
        self.model_faults = {}  # name -> (kind, after)
        for spec in a.model_fault:
            try:
                name, kind, after = spec.split(":")
                after = int(after)
            except ValueError:
                raise SystemExit("--model-fault %r: want NAME:KIND:N" % spec)
            if kind not in self.KINDS:
                raise SystemExit("--model-fault %r: KIND must be 500, 429 or unready" % spec)
            if not name.startswith("digits-"):
                name = "digits-" + name
            self.model_faults[name] = (self.KINDS[kind], after)
        self.lock = threading.Lock()
        self.rng = random.Random(a.seed)

    def model_unready(self, name):
        kind, after = self.model_faults.get(name, (None, 0))
        with self.lock:
            return kind == "unready" and self.per_model.get(name, 0) >= after

    def next(self, name=None):
        """Returns None, "unready", "fail", "throttle" or "crash"."""
        with self.lock:
            self.n += 1
            n, r = self.n, self.rng.random()
            m = self.per_model[name] = self.per_model.get(name, 0) + 1
        kind, after = self.model_faults.get(name, (None, 0))
        if kind and m > after:
            return kind
        a = self.a
        if a.unready_after and n > a.unready_after:
            return "unready"
        if a.crash_after and n > a.crash_after:
            return "crash"
        if n <= a.faults_after:
            return None
        if r < a.fail_rate:
            return "fail"
        if r < a.fail_rate + a.rate_429:
            return "throttle"
        return None

    def unready(self):
        with self.lock:
            return bool(self.a.unready_after) and self.n >= self.a.unready_after


PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?(/ready|/infer)?$")


def make_handler(models, faults, a):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the worker reuses connections
        server_version = "mlsched-digits/1"

        def log_message(self, fmt, *args):
            if a.verbose:
                sys.stderr.write("digits_server: " + (fmt % args) + "\n")

        def reply(self, code, obj, headers=None):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def model(self, m):
            name, version = m.group(1), m.group(2)
            if name not in models:
                self.reply(404, {"error": "unknown model %r (serving %s)" % (name, ", ".join(sorted(models)))})
                return None
            if version not in (None, VERSION):
                self.reply(404, {"error": "model %s has no version %r (only %s)" % (name, version, VERSION)})
                return None
            return name

        def do_GET(self):
            if self.path == "/v2/health/live":
                return self.reply(200, {"live": True})
            if self.path == "/v2/health/ready":
                ok = not faults.unready()
                return self.reply(200 if ok else 503, {"ready": ok})
            if self.path == "/v2":
                return self.reply(200, {"name": "mlsched-digits", "version": "1", "extensions": []})
            m = PATH.match(self.path)
            if not m or m.group(3) == "/infer":
                return self.reply(404, {"error": "no such endpoint: GET %s" % self.path})
            name = self.model(m)
            if name is None:
                return
            if m.group(3) == "/ready":
                ok = not faults.unready() and not faults.model_unready(name)
                return self.reply(200 if ok else 503, {"name": name, "ready": ok})
            self.reply(200, {
                "name": name, "versions": [VERSION], "platform": "sklearn",
                "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [-1, FEATURES]}],
                "outputs": [{"name": "label", "datatype": "INT64", "shape": [-1]},
                            {"name": "probabilities", "datatype": "FP32", "shape": [-1, CLASSES]}]})

        def do_POST(self):
            m = PATH.match(self.path)
            if not m or m.group(3) != "/infer":
                self.drain()
                return self.reply(404, {"error": "no such endpoint: POST %s" % self.path})
            try:
                length = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                length = -1
            if length < 0 or length > MAX_BODY:
                self.close_connection = True
                return self.reply(413, {"error": "request body over %d bytes" % MAX_BODY})
            raw = self.rfile.read(length)
            name = self.model(m)
            if name is None:
                return
            fault = faults.next(name)
            if a.latency_ms:
                time.sleep(a.latency_ms / 1000.0)
            if fault == "unready":
                return self.reply(503, {"error": "model %s is not ready" % name})
            if fault == "fail":
                return self.reply(500, {"error": "injected failure (--fail-rate)"})
            if fault == "throttle":
                return self.reply(429, {"error": "too many requests (--429-rate)"},
                                  {"Retry-After": str(a.retry_after)})
            try:
                req = json.loads(raw)
                inputs = req["inputs"] if isinstance(req, dict) else None
                if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
                    raise BadInput('want {"inputs": [one tensor of N x 64 pixels]}')
                if inputs[0].get("datatype") == "BYTES":
                    raise BadInput("datatype BYTES: want numbers")
                x = rows(inputs[0].get("data"))
            except (ValueError, KeyError, BadInput) as e:
                return self.reply(400, {"error": str(e)})
            labels, probs = predict(models[name], x)
            flat = [p for row in probs for p in row]
            resp = {"model_name": name, "model_version": VERSION, "outputs": [
                {"name": "label", "datatype": "INT64", "shape": [len(labels)], "data": labels},
                {"name": "probabilities", "datatype": "FP32", "shape": [len(labels), CLASSES], "data": flat}]}
            if isinstance(req.get("id"), str):
                resp["id"] = req["id"]
            self.reply(200, resp)

        def drain(self):
            try:
                n = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                n = 0
            if 0 < n <= MAX_BODY:
                self.rfile.read(n)
            else:
                self.close_connection = True

    return Handler


def serve_exec(models, faults, a):
    name, clf = next(iter(models.items()))
    out = sys.stdout

    def answer(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    def pixels(payload):
        data = payload.get("pixels") if isinstance(payload, dict) else payload
        if data is None:
            raise BadInput('want {"pixels": [64 numbers]} or the 64 numbers')
        return rows(data)

    def serve_batch(reqs):
        """One predict call for every request of a batch; a bad input fails alone."""
        fault = faults.next(name)
        if a.latency_ms:
            time.sleep(a.latency_ms / 1000.0)
        if fault == "crash":
            print("digits_server: exiting after %d requests (--crash-after)" % a.crash_after, file=sys.stderr, flush=True)
            sys.exit(3)
        good, x = [], []
        for r in reqs:
            rid = r.get("id", "") if isinstance(r, dict) else ""
            if fault in ("fail", "throttle", "unready"):
                answer({"id": rid, "error": "injected failure (%s)" % fault, "task_error": False})
                continue
            try:
                xs = pixels(r.get("payload") if isinstance(r, dict) else None)
            except BadInput as e:
                answer({"id": rid, "error": str(e), "task_error": True})
                continue
            good.append((rid, len(xs)))
            x.extend(xs)
        if not good:
            return
        labels, probs = predict(clf, x)
        i = 0
        for rid, n in good:
            if n == 1:
                answer({"id": rid, "output": {"label": labels[i], "probabilities": probs[i]}})
            else:
                answer({"id": rid, "output": {"label": labels[i:i + n], "probabilities": probs[i:i + n]}})
            i += n

    # "batch": true: the worker may send {"batch": [request, ...]} lines
    # (docs/models.md, exec protocol); each request is still answered alone.
    answer({"ready": True, "batch": True})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
        except ValueError as e:
            print("digits_server: bad request line: %s" % e, file=sys.stderr, flush=True)
            continue
        if isinstance(req, dict) and isinstance(req.get("batch"), list):
            serve_batch(req["batch"])
            continue
        rid = req.get("id", "")
        fault = faults.next(name)
        if a.latency_ms:
            time.sleep(a.latency_ms / 1000.0)
        if fault == "crash":
            print("digits_server: exiting after %d requests (--crash-after)" % a.crash_after, file=sys.stderr, flush=True)
            sys.exit(3)
        if fault in ("fail", "throttle", "unready"):
            answer({"id": rid, "error": "injected failure (%s)" % fault, "task_error": False})
            continue
        payload = req.get("payload")
        try:
            data = payload.get("pixels") if isinstance(payload, dict) else payload
            if data is None:
                raise BadInput('want {"pixels": [64 numbers]} or the 64 numbers')
            labels, probs = predict(clf, rows(data))
        except BadInput as e:
            answer({"id": rid, "error": str(e), "task_error": True})
            continue
        if len(labels) == 1:
            answer({"id": rid, "output": {"label": labels[0], "probabilities": probs[0]}})
        else:
            answer({"id": rid, "output": {"label": labels, "probabilities": probs}})


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--models", default="logreg,forest,knn", help="comma-separated: logreg, forest, knn")
    p.add_argument("--exec", action="store_true", help="serve the first of --models as an exec model (JSON lines)")
    p.add_argument("--holdout", type=int, default=4, help="train on images whose index is not a multiple of this")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fail-rate", type=float, default=0.0)
    p.add_argument("--429-rate", dest="rate_429", type=float, default=0.0)
    p.add_argument("--retry-after", type=int, default=1)
    p.add_argument("--faults-after", type=int, default=0)
    p.add_argument("--unready-after", type=int, default=0)
    p.add_argument("--crash-after", type=int, default=0)
    p.add_argument("--latency-ms", type=float, default=0.0)
    p.add_argument("--model-fault", action="append", default=[], metavar="NAME:KIND:N")
    p.add_argument("--verbose", action="store_true")
    a = p.parse_args()
    if a.holdout < 2:
        p.error("--holdout must be at least 2")
    faults = Faults(a)
    t0 = time.time()
    models = train([m.strip() for m in a.models.split(",") if m.strip()], a.holdout, a.seed)
    print("digits_server: trained %s in %.2fs" % (", ".join(sorted(models)), time.time() - t0), file=sys.stderr, flush=True)
    if a.exec:
        return serve_exec(models, faults, a)
    srv = ThreadingHTTPServer((a.host, a.port), make_handler(models, faults, a))
    srv.daemon_threads = True
    print("digits_server: OIP v2 on http://%s:%d" % (a.host, srv.server_address[1]), file=sys.stderr, flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
