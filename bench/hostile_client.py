#!/usr/bin/env python3
"""hostile_client.py: jouled against malformed and abusive clients on loopback.

Starts its own jouled (a copy of the binary, a temp state dir, a small config), then:

  1. a baseline: a "valid client" (its own process) alone: GET /healthz and a valid
     POST /v1/jobs in turn at --valid-rate, a fresh connection each, for --baseline-seconds;
  2. the flood: --requests malformed or abusive requests over raw sockets (asyncio, keep-alive
     and pipelining where the request is well framed, one connection each where it is not), in 16
     classes: number overflow, raw bytes in the target, bad UTF-8 in JSON, percent-encoded bad
     ids, garbage, truncated requests, bad methods, huge headers, header floods, oversize bodies,
     bad Content-Length, chunked abuse, smuggling shapes, hostile job fields and deep nesting,
     query abuse and tokens; progress reports with a running job's own token first;
  3. connection abuse: idle connections (2 x max_connections, from one source address and from
     many), slowloris (one header byte a second), slow readers; a prober and the valid client
     keep asking meanwhile;
  4. with --auth-requests > 0, the same again (shorter, no connection abuse) on a second jouled
     with [auth] tokens and local_users = "none", then every token variant once more from a
     child process running as --nonroot-uid (nobody): root is an admin on loopback by design;
  5. with --amplification N, a third jouled: N accepted jobs of each large but legal kind and
     the VmRSS each costs.

While it runs the valid client keeps going (latency against the baseline, failures by phase),
jouled's pid and VmRSS are sampled every 0.5 s (a dead jouled is restarted on the same port and
the crash counted, with the last requests sent; they are replayed one by one afterwards to find
the one that kills it). Checks: jouled never died; every 4xx/5xx is application/problem+json with
a JSON body holding "status"; no 5xx; the jobs stored are exactly those answered 201 (plus at
most the submissions that got no answer); every line of jouled's log starts with its log prefix;
no log line holds control characters (C0, DEL, C1, U+2028/9) or non-UTF-8 bytes; HEAD answers
carry no body; no request without a valid token was served when auth is on; well-framed
pipelined requests were all answered; the valid client was served throughout the flood. Prints
a table per run and exits 1 if a check failed (2 if jouled is missing).

Traffic goes to 127.0.0.1 only; the attacker's sockets use source addresses 127.0.0.2 and up
(--attacker-source) so that per-client limits can tell it from the valid client (127.0.0.1).
Every loop is bounded in count and time; --limit stops everything. Python 3 standard library only.
See bench/README.md, "Hostile clients".
"""

import argparse
import asyncio
import collections
import hashlib
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
LOG_LINE = re.compile(rb"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} (trace|debug|info|warning|error|critical): ")
LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")
CLASSES = ["overflow", "target-bytes", "json-utf8", "pct-id", "garbage", "truncated", "bad-method",
           "huge-headers", "header-flood", "oversize-body", "bad-cl", "chunked", "smuggling", "hostile-job",
           "query", "auth"]
WEIGHTS = {"overflow": 8, "target-bytes": 7, "json-utf8": 8, "pct-id": 8, "garbage": 6, "truncated": 6,
           "bad-method": 6, "huge-headers": 4, "header-flood": 2, "oversize-body": 2, "bad-cl": 5, "chunked": 6,
           "smuggling": 4, "hostile-job": 11, "query": 8, "auth": 7}
CONN_CLASSES = ["idle-1src", "idle-nsrc", "slowloris", "slow-read"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jouled", default=os.path.join(HERE, "..", "build", "daemon", "jouled"))
    p.add_argument("--requests", type=int, default=100000, help="malformed/abusive requests in the first run")
    p.add_argument("--auth-requests", type=int, default=20000,
                   help="requests in a second run with [auth] tokens (0: no second run)")
    p.add_argument("--connections", type=int, default=16, help="concurrent attacker connections in the flood")
    p.add_argument("--pipeline", type=int, default=8, help="well-framed requests sent back to back per connection")
    p.add_argument("--max-connections", type=int, default=64, help="[server] max_connections of the jouled")
    p.add_argument("--max-per-client", type=int, default=32,
                   help="[server] max_connections_per_client (0: leave the key out)")
    p.add_argument("--idle-timeout", type=float, default=3.0, help="[server] idle_timeout_seconds (0: leave out)")
    p.add_argument("--request-timeout", type=float, default=5.0, help="[server] request_timeout_seconds")
    p.add_argument("--max-body", type=int, default=262144, help="[server] max_body_bytes")
    p.add_argument("--valid-rate", type=float, default=10.0, help="valid requests per second (healthz, submit in turn)")
    p.add_argument("--baseline-seconds", type=float, default=20.0)
    p.add_argument("--abuse-seconds", type=float, default=0.0,
                   help="length of each connection-abuse phase (default 2 x request timeout + 2)")
    p.add_argument("--no-conn-abuse", action="store_true", help="skip the connection-abuse phases")
    p.add_argument("--amplification", type=int, default=100,
                   help="a third jouled: this many accepted jobs of each large kind, RSS per job (0: skip)")
    p.add_argument("--attacker-source", default="127.0.0.2", help="first source address of attacker sockets")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--limit", type=float, default=1800.0, help="watchdog: stop everything after this many seconds")
    p.add_argument("--keep", action="store_true", help="keep the temp dirs (configs, logs, state)")
    p.add_argument("--json", default="", help="write every figure here")
    p.add_argument("--repro-dir", default="/tmp", help="where reproducers of crashes are written")
    # internal: the valid client's own process
    p.add_argument("--valid-client", nargs=6, metavar=("PORT", "TOKEN", "RATE", "SECONDS", "OUT", "STOPFILE"),
                   help=argparse.SUPPRESS)
    p.add_argument("--marker", default="", help=argparse.SUPPRESS)
    p.add_argument("--auth-probe", nargs=4, metavar=("PORT", "TOKEN", "JOB", "N"), help=argparse.SUPPRESS)
    p.add_argument("--nonroot-uid", type=int, default=65534,
                   help="the user the token checks are also sent as in the auth run (default nobody)")
    return p.parse_args(argv)


def pct(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q / 100.0 * (len(s) - 1)))))]


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


# ------------------------------------------------------------------ blocking HTTP (set-up, checks)


def call(port, method, path, body=None, token=None, timeout=15, source="127.0.0.1"):
    """(status, parsed JSON or raw text or None, headers) of one request on a fresh connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout, source_address=(source, 0))
    try:
        headers = {}
        if token:
            headers["Authorization"] = "Bearer " + token
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = raw.decode("utf-8", "replace")
        return resp.status, parsed, dict(resp.getheaders())
    finally:
        conn.close()


# ------------------------------------------------------------------ the valid client (own process)


def valid_client_main(port, token, rate, seconds, out, stopfile, marker):
    """GET /healthz and a valid POST /v1/jobs in turn, each on a fresh connection, at `rate`
    per second, until `seconds` have passed or `stopfile` exists. One JSON line per request."""
    token = None if token == "-" else token
    port, rate, seconds = int(port), float(rate), float(seconds)
    body = json.dumps({"name": "ok", "run": {"command": ["true"], "env": {"HOSTILE_RUN": marker}}}).encode()
    interval = 1.0 / rate
    start = time.monotonic()
    next_t = start
    n = 0
    with open(out, "w") as f:
        while time.monotonic() - start < seconds and n < int(rate * seconds) + 10 and not os.path.exists(stopfile):
            kind = "healthz" if n % 2 == 0 else "submit"
            n += 1
            t0 = time.monotonic()
            rec = {"t": t0, "kind": kind, "status": None, "err": None, "id": None}
            try:
                if kind == "healthz":
                    status, parsed, _ = call(port, "GET", "/healthz", token=token, timeout=10)
                else:
                    status, parsed, _ = call(port, "POST", "/v1/jobs", body=body, token=token, timeout=10)
                    if status == 201 and isinstance(parsed, dict):
                        rec["id"] = parsed.get("id")
                rec["status"] = status
            except Exception as e:  # any failure of a valid request is a figure, not a crash of the client
                rec["err"] = type(e).__name__ + ": " + str(e)[:120]
            rec["ms"] = (time.monotonic() - t0) * 1000.0
            f.write(json.dumps(rec) + "\n")
            f.flush()
            next_t += interval
            now = time.monotonic()
            if next_t < now - 1.0:
                next_t = now  # fell behind (a slow answer): no burst to catch up
            time.sleep(max(0.0, next_t - now))
    return 0


class ValidClient:
    def __init__(self, run, name, seconds):
        self.out = os.path.join(run.dir, f"valid-{name}.jsonl")
        self.stop = os.path.join(run.dir, f"valid-{name}.stop")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--marker", run.marker, "--valid-client", str(run.daemon.port),
             run.token or "-", str(ARGS.valid_rate), str(seconds), self.out, self.stop],
            stdin=subprocess.DEVNULL)
        run.children.append(self.proc)

    def finish(self, timeout=30):
        with open(self.stop, "w"):
            pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        rows = []
        with open(self.out) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
        return rows


# ------------------------------------------------------------------ jouled: start, watch, restart


class Daemon:
    """One jouled: its config, state dir, log files (one per start) and the port it keeps."""

    def __init__(self, run, config_text):
        self.run = run
        self.config = os.path.join(run.dir, "jouled.toml")
        with open(self.config, "w") as f:
            f.write(config_text)
        self.state = os.path.join(run.dir, "state")
        self.port = 0
        self.logs = []
        self.proc = None
        self.lock = threading.RLock()

    def start(self):
        with self.lock:
            log_path = os.path.join(self.run.dir, f"jouled-{len(self.logs) + 1}.log")
            self.logs.append(log_path)
            log = open(log_path, "wb")
            self.proc = subprocess.Popen(
                [self.run.binary, "--state-dir", self.state, "--listen", f"127.0.0.1:{self.port}", "--config",
                 self.config], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            log.close()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with open(log_path, "rb") as f:
                    m = LISTENING.search(f.read().decode("utf-8", "replace"))
                if m:
                    self.port = int(m.group(1))
                    return
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
            with open(log_path, "rb") as f:
                tail = f.read()[-3000:].decode("utf-8", "replace")
            raise RuntimeError(f"jouled did not start (exit {self.proc.poll()}):\n{tail}")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def rss_kb(self):
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except (OSError, ValueError):
            return None
        return None

    def log_tail(self, n=15):
        try:
            with open(self.logs[-1], "rb") as f:
                return f.read().splitlines()[-n:]
        except OSError:
            return []

    def stop(self):
        with self.lock:
            if self.proc and self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()


class Monitor(threading.Thread):
    """Every 0.5 s: is jouled alive (else: count the crash, keep the last requests sent, restart it
    on the same port), and its VmRSS."""

    def __init__(self, daemon, recent):
        super().__init__(daemon=True)
        self.daemon_ = daemon
        self.recent = recent
        self.samples = []  # (monotonic, rss kB)
        self.crashes = []
        self.dead_samples = 0
        self.auto_restart = True
        self.stop_flag = threading.Event()

    def run(self):
        while not self.stop_flag.wait(0.5):
            self.check()

    def check(self):
        with self.daemon_.lock:
            if self.daemon_.alive():
                rss = self.daemon_.rss_kb()
                if rss:
                    self.samples.append((time.monotonic(), rss))
                return
            self.dead_samples += 1
            if not self.auto_restart:
                return
            self.record_crash()
            for attempt in range(10):
                try:
                    self.daemon_.start()
                    print(f"  jouled restarted on port {self.daemon_.port}", flush=True)
                    return
                except RuntimeError as e:
                    print(f"  restart {attempt + 1} failed: {e}", flush=True)
                    time.sleep(1)

    def record_crash(self):
        now = time.monotonic()
        code = self.daemon_.proc.returncode
        recent = list(self.recent)
        suspects = [r for r in recent if r[0] >= now - 3.0] or recent[-64:]
        last = recent[-1] if recent else (now, "-", "-", b"")
        crash = {"t": now, "exit": code, "signal": -code if code is not None and code < 0 else None,
                 "last_class": last[1], "last_variant": last[2], "suspects": suspects,
                 "log_tail": [l.decode("utf-8", "replace") for l in self.daemon_.log_tail()]}
        self.crashes.append(crash)
        print(f"  !! jouled died (exit {code}); last request sent: {last[1]} / {last[2]}", flush=True)
        for line in crash["log_tail"][-5:]:
            print("     log: " + line[:200], flush=True)


# ------------------------------------------------------------------ hostile requests


class Item:
    """One request: its class and variant, the bytes, how it is sent (pipe: well framed, may share
    a keep-alive connection; single: a connection of its own, write side closed after it; hold:
    a connection of its own, left open), whether an HTTP answer is expected, the statuses that
    are right (None: any), and whether it may create a job."""

    __slots__ = ("cls", "variant", "data", "mode", "need", "method", "creates", "expect", "tries", "bypass")

    def __init__(self, cls, variant, data, mode="pipe", need=True, method="GET", creates=False, expect=None,
                 bypass=False):
        self.cls, self.variant, self.data, self.mode, self.need = cls, variant, data, mode, need
        self.method, self.creates, self.expect, self.tries, self.bypass = method, creates, expect, 0, bypass


def B(x):
    return x.encode() if isinstance(x, str) else x


def jb(obj):
    return json.dumps(obj, separators=(",", ":")).encode()


E400 = frozenset([400])
E401 = frozenset([401])
E413 = frozenset([413])
OK_RUN = {"command": ["true"]}
MODEL = {"input": {"shape": [16]}, "layers": [{"type": "linear", "out_features": 4}, {"type": "relu"}]}
TRAINING = {"batch_size": 8, "epochs": 1, "samples_per_epoch": 64}
BAD_UTF8 = [b"\xff", b"\xfe\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80",
            b"a\xffb", b"\xf8\x88\x80\x80\x80", b"\xc3"]
BAD_PCT = ["%ff", "%0a", "%00", "%0d%0a", "%1b%5b31m", "%c0%af", "%ed%a0%80", "%f4%90%80%80", "%7f", "%fe%ff",
           "%e2%82", "a%ffb", "%09", "%08", "x%0d%0a2026-01-01T00:00:00.000%20critical:%20forged"]
ODD_PCT = ["%e2%80%a8", "%c2%85", "%e2%80%ae", "%2f", "%2e%2e", "%", "%g1", "%%", "%f", "+", "%c2%9b31m", "%20"]
INT64_MAX = 2 ** 63 - 1
UINT64_MAX = 2 ** 64 - 1


class Catalog:
    """Every request the flood sends, by class. `ctx` supplies the token, ids and limits."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.static = collections.defaultdict(list)
        self.dynamic = collections.defaultdict(list)
        for cls in CLASSES:
            getattr(self, "build_" + cls.replace("-", "_"))()

    # --- helpers
    def req(self, method, target, headers=(), body=None, token=True, version=b"HTTP/1.1", host=True, cl=True):
        lines = [B(method) + b" " + B(target) + b" " + B(version)]
        if host:
            lines.append(b"Host: 127.0.0.1")
        if token is True and self.ctx.token:
            lines.append(b"Authorization: Bearer " + self.ctx.token.encode())
        elif isinstance(token, (bytes, str)):
            lines.append(b"Authorization: " + B(token))
        lines.extend(B(h) for h in headers)
        if body is not None and cl:
            lines.append(b"Content-Length: %d" % len(body))
        return b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")

    def add(self, cls, variant, data, weight=1, **kw):
        self.static[cls].append((weight, Item(cls, variant, data, **kw)))

    def post(self, cls, variant, target, body, weight=1, expect=None, mode="pipe", **kw):
        creates = B(target).split(b"?")[0] == b"/v1/jobs"
        self.add(cls, variant, self.req("POST", target, [b"Content-Type: application/json"], body), weight,
                 method="POST", creates=creates, expect=expect, mode=mode, **kw)

    # --- classes
    def build_overflow(self):
        c = self.ctx
        targets = ["/v1/jobs/x/progress", f"/v1/jobs/{c.job}/progress"]
        for body in [b'{"epoch":1e400,"epochs":2}', b'{"epoch":-1e400,"epochs":2}', b'{"epoch":1,"epochs":1e309}',
                     b'{"epoch":' + b"9" * 400 + b',"epochs":2}', b'{"epoch":1' + b"0" * 310 + b'}',
                     b'[1e400]', b'1e400', b'{"epoch":1E+99999}']:
            for t in targets:
                self.post("overflow", f"progress {body[:24]!r}", t, body, expect=E400)
        for name, body in [
                ("job priority 1e400", b'{"name":"n","priority":1e400,"run":{"command":["true"]}}'),
                ("job priority -1e400", b'{"name":"n","priority":-1e400,"run":{"command":["true"]}}'),
                ("job epochs 1e400", b'{"run":{"command":["true"]},"training":{"batch_size":1,"epochs":1e400,'
                                     b'"samples_per_epoch":1}}'),
                ("job deadline 1e400", b'{"run":{"command":["true"]},"constraints":{"deadline":1e400}}'),
                ("job shape 1e400", b'{"run":{"command":["true"]},"model":{"input":{"shape":[1e400]},'
                                    b'"layers":[{"type":"linear","out_features":1}]}}'),
                ("job 400-digit priority", b'{"run":{"command":["true"]},"priority":' + b"1" * 400 + b"}"),
                ("estimate out_features 1e400", b'{"model":{"input":{"shape":[16]},"layers":[{"type":"linear",'
                                                b'"out_features":1e400}]},"training":{"samples_per_epoch":1}}'),
                ("estimate batch 1e400", b'{"model":{"input":{"shape":[16]},"layers":[{"type":"linear",'
                                         b'"out_features":2}]},"training":{"batch_size":1e400,"samples_per_epoch":1}}')]:
            self.post("overflow", name, "/v1/estimate" if name.startswith("estimate") else "/v1/jobs", body,
                      expect=E400)
        # Numbers a double or an int64 holds, but only just: the answer may be 200/201 or 400; never 5xx.
        big = [INT64_MAX, UINT64_MAX, 2 ** 62, 2 ** 31, 2 ** 32 + 1]
        for v in big:
            model = {"input": {"shape": [16]}, "layers": [{"type": "linear", "out_features": v}]}
            self.post("overflow", f"estimate out_features {v}", "/v1/estimate",
                      jb({"model": model, "training": TRAINING}))
            self.post("overflow", f"estimate shape [{v}]", "/v1/estimate", jb(
                {"model": {"input": {"shape": [v]}, "layers": [{"type": "linear", "out_features": 2}]},
                 "training": TRAINING}))
            self.post("overflow", f"estimate training {v}", "/v1/estimate", jb(
                {"model": MODEL, "training": {"batch_size": 2, "epochs": v, "samples_per_epoch": v}}))
            self.post("overflow", f"job model out_features {v}", "/v1/jobs",
                      jb({"name": "big", "model": model, "training": TRAINING, "run": OK_RUN}))
        for name, model in [
                ("conv kernel INT64_MAX", {"input": {"shape": [3, 32, 32]}, "layers": [
                    {"type": "conv2d", "out_channels": 4, "kernel_size": INT64_MAX}]}),
                ("conv stride/padding INT64_MAX", {"input": {"shape": [3, 32, 32]}, "layers": [
                    {"type": "conv2d", "out_channels": 4, "kernel_size": 3, "stride": INT64_MAX,
                     "padding": INT64_MAX}]}),
                ("shape 2^62 x 2^62", {"input": {"shape": [2 ** 62, 2 ** 62]}, "layers": [{"type": "flatten"},
                                                                                        {"type": "linear",
                                                                                         "out_features": 2}]}),
                ("embedding 2^62", {"input": {"shape": [8], "dtype": "token"}, "layers": [
                    {"type": "embedding", "num_embeddings": 2 ** 62, "embedding_dim": 2 ** 62}]}),
                ("lstm 2^40 x 2^20", {"input": {"shape": [4, 8]}, "layers": [
                    {"type": "lstm", "hidden_size": 2 ** 40, "num_layers": 2 ** 20}]}),
                ("attention heads INT64_MAX", {"input": {"shape": [4, 8]}, "layers": [
                    {"type": "multihead_attention", "num_heads": INT64_MAX}]}),
                ("maxpool kernel > input", {"input": {"shape": [1, 4, 4]}, "layers": [
                    {"type": "maxpool2d", "kernel_size": 1000}]}),
                ("dropout p 0.9999999999999999", {"input": {"shape": [4]}, "layers": [
                    {"type": "dropout", "p": 0.9999999999999999}]}),
                ("1000 dims", {"input": {"shape": [1] * 1000}, "layers": [{"type": "flatten"}]})]:
            self.post("overflow", "estimate " + name, "/v1/estimate", jb({"model": model, "training": TRAINING}))
        for v in [b"1e-400", b"-0", b"1.7976931348623157e308", b"4.9e-324", b"0.0000000000000000000001"]:
            self.post("overflow", f"estimate batch {v.decode()}", "/v1/estimate",
                      b'{"model":' + jb(MODEL) + b',"training":{"batch_size":' + v + b',"samples_per_epoch":1}}')

    def build_target_bytes(self):
        raw = [b"/\xff", b"/v1/jobs/\xff\xfe", b"/\x01", b"/v1/\x7f", b"/healthz\x00", b"/v1/jobs/a\x1b[31m",
               b"/v1/jobs?state=\xff", b"/v1/jobs/\xc0\xaf/log", b"/\x0b", b"/v1/jobs/\xc2\x85",
               b"/v1/jobs/\xe2\x80\xa8", b"/v1/jobs/x\ry", b"/v1/jobs/x\ty", b"/healthz\x1b]0;pwned\x07"]
        for t in raw:
            self.add("target-bytes", f"GET {t!r}", self.req("GET", t), mode="single", expect=E400)
        for t, expect in [(b"*", E400), (b"http://127.0.0.1/healthz", None), (b"healthz", E400),
                          (b"//", None), (b"/v1//jobs//", None), (b"/v1/jobs/../../../../etc/passwd", None),
                          (b"/" + b"a" * 8000, None), (b"/v1/jobs/" + b"b" * 15000, None),
                          (b"/" + b"c" * 20000, None), (b"/healthz#frag", None), (b"/healthz?", None)]:
            self.add("target-bytes", f"GET {t[:40]!r}{'...' if len(t) > 40 else ''}", self.req("GET", t),
                     mode="single", expect=expect)
        for t in [b"/\xff", b"/v1/jobs/\x00"]:
            self.post("target-bytes", f"POST {t!r}", t, jb({"run": OK_RUN}), mode="single", expect=E400)

    def build_json_utf8(self):
        c = self.ctx
        for x in BAD_UTF8:
            for name, body, target in [
                    ("name", b'{"name":"' + x + b'","run":{"command":["true"]}}', "/v1/jobs"),
                    ("env name", b'{"run":{"command":["true"],"env":{"' + x + b'":"1"}}}', "/v1/jobs"),
                    ("env value", b'{"run":{"command":["true"],"env":{"A":"' + x + b'"}}}', "/v1/jobs"),
                    ("argv", b'{"run":{"command":["true","' + x + b'"]}}', "/v1/jobs"),
                    ("workdir", b'{"run":{"command":["true"],"workdir":"/' + x + b'"}}', "/v1/jobs"),
                    ("device", b'{"run":{"command":["true"]},"constraints":{"devices":["' + x + b'"]}}', "/v1/jobs"),
                    ("member name", b'{"' + x + b'":1,"run":{"command":["true"]}}', "/v1/jobs"),
                    ("layer type", b'{"model":{"input":{"shape":[4]},"layers":[{"type":"' + x + b'"}]},'
                                   b'"training":{"samples_per_epoch":1}}', "/v1/estimate"),
                    ("epoch", b'{"epoch":"' + x + b'","epochs":2}', f"/v1/jobs/{c.job}/progress"),
                    ("epoch (no job)", b'{"epoch":"' + x + b'","epochs":2}', "/v1/jobs/x/progress")]:
                self.post("json-utf8", f"{name} {x!r}", target, body, expect=E400)
        for name, body, expect in [
                ("byte outside a string", b'{"name":"a"\xff,"run":{"command":["true"]}}', E400),
                ("lone surrogate escape", b'{"name":"\\ud800","run":{"command":["true"]}}', E400),
                ("reversed surrogates", b'{"name":"\\udc00\\ud800","run":{"command":["true"]}}', E400),
                ("surrogate + letter", b'{"name":"\\ud800\\u0041","run":{"command":["true"]}}', E400),
                ("NUL escape in name", b'{"name":"a\\u0000b","run":{"command":["true"]}}', E400),
                ("NUL escape in argv", b'{"run":{"command":["true","a\\u0000b"]}}', E400),
                ("NUL escape in env value", b'{"run":{"command":["true"],"env":{"A":"a\\u0000b"}}}', E400),
                ("NUL escape in env name", b'{"run":{"command":["true"],"env":{"A\\u0000B":"1"}}}', E400),
                ("NUL escape in workdir", b'{"run":{"command":["true"],"workdir":"/tmp\\u0000/x"}}', None),
                ("UTF-8 BOM", b'\xef\xbb\xbf{"name":"bom","run":{"command":["true"]}}', None),
                ("UTF-16 body", '{"run":{"command":["true"]}}'.encode("utf-16"), E400),
                ("UTF-32 body", '{"run":{"command":["true"]}}'.encode("utf-32"), E400),
                ("NUL byte in body", b'{"run":{"command":["true"]}}\x00', E400),
                ("NUL byte, then garbage", b'{"run":{"command":["true"]}}\x00\xff{"name":"\n', E400),
                ("NUL byte inside the object", b'{"run":{"command":["true"]}\x00}', E400)]:
            self.post("json-utf8", name, "/v1/jobs", body, expect=expect)

    def build_pct_id(self):
        c = self.ctx
        for i in BAD_PCT:
            for method, target, body in [
                    ("GET", f"/v1/jobs/{i}", None), ("DELETE", f"/v1/jobs/{i}", None),
                    ("GET", f"/v1/jobs/{i}/log", None), ("POST", f"/v1/jobs/{i}/pause", b"{}"),
                    ("POST", f"/v1/jobs/{i}/progress", b'{"epoch":1,"epochs":2}'), ("GET", f"/v1/probes/{i}", None),
                    ("GET", f"/{i}", None), ("GET", f"/v1/{i}", None), ("GET", f"/v1/jobs?state={i}", None),
                    ("GET", f"/v1/jobs?{i}=1", None), ("GET", f"/v1/jobs/{c.job}/log?stream={i}", None),
                    ("GET", f"/v1/jobs?limit={i}", None)]:
                self.add("pct-id", f"{method} {target.replace(c.job, 'ID')}", self.req(method, target, body=body),
                         method=method, expect=E400)
        for i in ODD_PCT:
            for method, target in [("GET", f"/v1/jobs/{i}"), ("DELETE", f"/v1/jobs/{i}"),
                                   ("GET", f"/v1/jobs/{i}/log"), ("GET", f"/v1/jobs?state={i}")]:
                self.add("pct-id", f"{method} {target}", self.req(method, target), method=method)

    def build_garbage(self):
        static = [
            ("TLS ClientHello", bytes.fromhex("16030100a5010000a10303") + bytes(range(32)) + b"\x00\x02\x13\x01\x01\x00"),
            ("HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
            ("HTTP/0.9", b"GET /healthz\r\n\r\n"), ("HTTP/9.9", b"GET /healthz HTTP/9.9\r\n\r\n"),
            ("HTTP/1.1 LF only", b"GET /healthz HTTP/1.1\nHost: x\n\n"), ("bad protocol", b"GET / FOO/1.1\r\n\r\n"),
            ("NULs", b"\x00" * 4096), ("CRLFs", b"\r\n" * 5000), ("spaces", b" " * 8000),
            ("SSH banner", b"SSH-2.0-OpenSSH_9.2\r\n"), ("SMTP", b"EHLO x\r\n"), ("just GET", b"GET"),
            ("PROXY v1", b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"),
            ("websocket upgrade", b"GET /healthz HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                                  b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
                                  b"\x81\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58"),
            ("h2c upgrade", b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                            b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n")]
        for name, data in static:
            self.add("garbage", name, data, mode="single", need=False)

        def random_bytes(rng):
            n = rng.choice([1, 2, 7, 64, 512, 2048, rng.randint(1, 4096)])
            return Item("garbage", "random bytes", rng.randbytes(n), mode="single", need=False)

        def random_text(rng):
            n = rng.randint(1, 2048)
            alphabet = "GETPOSHD /v1jobs?&=%:\r\n HTTP/1.1\x00\x7f\t"
            return Item("garbage", "random request-ish text", "".join(rng.choice(alphabet) for _ in range(n))
                        .encode(), mode="single", need=False)

        def mutated(rng):
            base = bytearray(self.req("POST", "/v1/jobs", [b"Content-Type: application/json"], jb({"run": OK_RUN})))
            for _ in range(rng.randint(1, 8)):
                base[rng.randrange(len(base))] = rng.randrange(256)
            return Item("garbage", "valid request, random bytes flipped", bytes(base), mode="single", need=False,
                        method="POST", creates=True)

        self.dynamic["garbage"] += [(5, random_bytes), (2, random_text), (3, mutated)]

    def build_truncated(self):
        reqs = [self.req("GET", "/healthz"), self.req("GET", "/v1/jobs?limit=5"),
                self.req("POST", "/v1/jobs", [b"Content-Type: application/json"], jb({"name": "t", "run": OK_RUN})),
                self.req("POST", "/v1/estimate", [], jb({"model": MODEL, "training": TRAINING})),
                self.req("POST", "/v1/jobs", [b"Transfer-Encoding: chunked"], None) + b"5\r\n{\"run\r\n"]

        def cut(rng):
            r = rng.choice(reqs)
            return Item("truncated", "cut, then write side closed", r[:rng.randint(1, len(r) - 1)], mode="single",
                        need=False, method="POST" if r.startswith(b"POST") else "GET",
                        creates=r.startswith(b"POST /v1/jobs"))

        def hold(rng):
            r = rng.choice(reqs)
            return Item("truncated", "cut, then left open", r[:rng.randint(1, len(r) - 1)], mode="hold", need=False,
                        method="POST" if r.startswith(b"POST") else "GET", creates=r.startswith(b"POST /v1/jobs"))

        self.dynamic["truncated"] += [(50, cut), (1, hold)]

    def build_bad_method(self):
        for data, method, mode in [
                (self.req("FOO", "/healthz"), "FOO", "pipe"), (self.req("get", "/healthz"), "get", "pipe"),
                (self.req("PATCH", "/v1/jobs", body=b"{}"), "PATCH", "pipe"),
                (self.req("PUT", f"/v1/jobs/{self.ctx.job}", body=b"{}"), "PUT", "pipe"),
                (self.req("TRACE", "/"), "TRACE", "pipe"), (self.req("OPTIONS", "*"), "OPTIONS", "single"),
                (self.req("CONNECT", "127.0.0.1:22"), "CONNECT", "single"),
                (self.req("DELETE", "/v1/jobs"), "DELETE", "pipe"), (self.req("POST", "/healthz", body=b"{}"), "POST", "pipe"),
                (self.req("DELETE", "/metrics"), "DELETE", "pipe"), (self.req("M-SEARCH", "/"), "M-SEARCH", "pipe"),
                (self.req("PROPFIND", "/v1/jobs"), "PROPFIND", "pipe"), (self.req("QUERY", "/v1/jobs"), "QUERY", "pipe"),
                (self.req("A" * 4000, "/healthz"), "long", "single"), (self.req(b"G\xffT", "/healthz"), "G\\xffT", "single"),
                (self.req("GET\t", "/healthz"), "GET<tab>", "single"), (b" " + self.req("GET", "/healthz"), "lead space", "single"),
                (b"\r\n\r\n" + self.req("GET", "/healthz"), "lead CRLFs", "single"),
                (self.req("GET", "/healthz", version=b"http/1.1"), "lowercase version", "single"),
                (self.req("GET", "/healthz", version=b"HTTP/1.0"), "HTTP/1.0", "single"),
                (self.req("GET", "/healthz", version=b"HTTP/2.0"), "HTTP/2.0", "single"),
                (self.req("GET", "/healthz", version=b"HTTP/1.10"), "HTTP/1.10", "single"),
                (self.req("GET", "/healthz", host=False, version=b"HTTP/1.1"), "no Host", "pipe"),
                (self.req("HEAD", "/v1/jobs/%ff"), "HEAD", "single"), (self.req("HEAD", "/nope"), "HEAD", "single"),
                (self.req("HEAD", "/healthz"), "HEAD", "single")]:
            self.add("bad-method", f"{method} {data[:40]!r}", data, mode=mode,
                     method="HEAD" if method == "HEAD" else "X")

    def build_huge_headers(self):
        for name, headers, expect in [
                ("20 KB header value", [b"X-Big: " + b"a" * 20000], frozenset([431])),
                ("15 KB header value", [b"X-Big: " + b"a" * 15000], None),
                ("10 KB header name", [b"X-" + b"n" * 10000 + b": 1"], None),
                ("space in header name", [b"Bad Header: x"], E400),
                ("header value \\xff\\xfe", [b"X-Bin: \xff\xfe"], None),
                ("NUL in header value", [b"X-Nul: a\x00b"], E400),
                ("ESC in header value", [b"X-Esc: \x1b[2J"], None),
                ("obs-fold", [b"X-Fold: a", b" continued"], None),
                ("line without colon", [b"NoColonHere"], E400),
                ("empty header name", [b": value"], E400),
                ("bare CR", [b"X-Cr: a\rb"], E400),
                ("16 KB bearer token", [b"Authorization: Bearer " + b"t" * 16000], None),
                ("Host twice", [b"Host: a", b"Host: b"], None),
                ("Expect: 100-continue", [b"Expect: 100-continue"], None)]:
            self.add("huge-headers", name, self.req("GET", "/v1/jobs?limit=1", headers), mode="single", expect=expect)
        self.add("huge-headers", "100 KB cookie", self.req("GET", "/v1/jobs?limit=1", [b"Cookie: " + b"c=1; " * 20000]),
                 0.3, mode="single", expect=frozenset([431]))

    def build_header_flood(self):
        for name, headers in [("1,000 small headers", [b"X-%d: v" % i for i in range(1000)]),
                              ("3,000 small headers", [b"X-%d: v" % i for i in range(3000)]),
                              ("1,000 x Content-Type", [b"Content-Type: application/json"] * 1000),
                              ("500 x Authorization", [b"Authorization: Bearer x"] * 500),
                              ("2,000 empty values", [b"X-E:"] * 2000),
                              ("1,500 x Connection: keep-alive", [b"Connection: keep-alive"] * 1500)]:
            self.add("header-flood", name, self.req("GET", "/healthz", headers), mode="single")

    def build_oversize_body(self):
        limit = self.ctx.max_body
        head = lambda cl, extra=(): self.req("POST", "/v1/jobs", [b"Content-Type: application/json",
                                                                  b"Content-Length: " + B(str(cl))] + list(extra),
                                             None, cl=False)
        for name, data, expect in [
                ("Content-Length limit+1, 4 KB sent", head(limit + 1) + b"[" * 4096, E413),
                ("Content-Length 10^18", head(10 ** 18) + b"{}", E413),
                ("Content-Length 2^64-1", head(UINT64_MAX) + b"{}", None),
                ("Content-Length 2^64+5 (wraps to 5?)", head(2 ** 64 + 5) + b"{}   ", None),
                ("Content-Length 10^30", head(10 ** 30) + b"{}", None),
                ("Expect 100-continue, limit+1", head(limit + 1, [b"Expect: 100-continue"]), E413),
                ("estimate limit+1", self.req("POST", "/v1/estimate", [b"Content-Length: %d" % (limit + 1)], None,
                                              cl=False) + b"{" * 1024, E413)]:
            self.add("oversize-body", name, data, mode="single", method="POST", creates=True, expect=expect)
        chunk = b"1" * 65536
        body = b"".join(b"%x\r\n" % len(chunk) + chunk + b"\r\n" for _ in range(limit // len(chunk) + 1)) + b"0\r\n\r\n"
        self.add("oversize-body", "chunked, limit+64 KB", self.req("POST", "/v1/jobs", [b"Transfer-Encoding: chunked"],
                                                                    None) + body, weight=0.2, mode="single",
                 method="POST", creates=True, expect=E413)

    def build_bad_cl(self):
        body = jb({"name": "cl", "run": OK_RUN})
        base = lambda cls_headers, b=body: self.req("POST", "/v1/jobs", [b"Content-Type: application/json"] +
                                                    cls_headers, None, cl=False) + b
        for name, data, expect in [
                ("Content-Length -1", base([b"Content-Length: -1"]), E400),
                ("Content-Length abc", base([b"Content-Length: abc"]), E400),
                ("Content-Length 1, 2", base([b"Content-Length: 1, 2"]), E400),
                ("two different Content-Lengths", base([b"Content-Length: %d" % len(body), b"Content-Length: 3"]), E400),
                ("two equal Content-Lengths", base([b"Content-Length: %d" % len(body)] * 2), None),
                ("Content-Length +N", base([b"Content-Length: +%d" % len(body)]), None),
                ("Content-Length 0xN", base([b"Content-Length: 0x%x" % len(body)]), E400),
                ("Content-Length N with tab", base([b"Content-Length: %d\t" % len(body)]), None),
                ("Content-Length 000N", base([b"Content-Length: 0000000000000000000000%d" % len(body)]), None),
                ("Content-Length larger than body", base([b"Content-Length: %d" % (len(body) + 50)]), None),
                ("Content-Length smaller than body", base([b"Content-Length: 5"]), None),
                ("Content-Length 0 with body", base([b"Content-Length: 0"]), None),
                ("Content-Length empty", base([b"Content-Length: "]), E400),
                ("Content-Length 1e3", base([b"Content-Length: 1e3"]), E400),
                ("GET with body", self.req("GET", "/v1/jobs?limit=1", [b"Content-Length: 5"], None, cl=False)
                 + b"hello", None),
                ("POST without length", self.req("POST", "/v1/jobs", [], None, cl=False) + body, None)]:
            self.add("bad-cl", name, data, mode="single", method="POST", creates=True, expect=expect)

    def build_chunked(self):
        body = jb({"name": "ch", "run": OK_RUN})
        te = lambda headers: self.req("POST", "/v1/jobs", [b"Content-Type: application/json"] + headers, None, cl=False)
        good = b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
        for name, data, expect, *weight in [
                ("valid chunked (control)", te([b"Transfer-Encoding: chunked"]) + good, None),
                ("chunk size zz", te([b"Transfer-Encoding: chunked"]) + b"zz\r\nabc\r\n0\r\n\r\n", E400),
                ("chunk size overflow", te([b"Transfer-Encoding: chunked"]) + b"f" * 40 + b"\r\nabc\r\n0\r\n\r\n", None),
                ("chunk size -1", te([b"Transfer-Encoding: chunked"]) + b"-1\r\nabc\r\n0\r\n\r\n", E400),
                ("no last chunk", te([b"Transfer-Encoding: chunked"]) + b"%x\r\n" % len(body) + body + b"\r\n", None),
                ("20 KB chunk extension", te([b"Transfer-Encoding: chunked"]) + b"%x;" % len(body) + b"e" * 20000
                 + b"\r\n" + body + b"\r\n0\r\n\r\n", None),
                ("chunked, identity", te([b"Transfer-Encoding: chunked, identity"]) + good, None),
                ("gzip, chunked", te([b"Transfer-Encoding: gzip, chunked"]) + good, None),
                ("identity", te([b"Transfer-Encoding: identity"]) + body, None),
                ("xchunked", te([b"Transfer-Encoding: xchunked"]) + good, None),
                ("chunked twice", te([b"Transfer-Encoding: chunked", b"Transfer-Encoding: chunked"]) + good, None),
                ("chunked on HTTP/1.0", self.req("POST", "/v1/jobs", [b"Transfer-Encoding: chunked"], None, cl=False,
                                                 version=b"HTTP/1.0") + good, None),
                ("trailer Content-Length", te([b"Transfer-Encoding: chunked"]) + b"%x\r\n" % len(body) + body
                 + b"\r\n0\r\nContent-Length: 5\r\nX-T: \xff\r\n\r\n", None),
                ("chunk without CRLF", te([b"Transfer-Encoding: chunked"]) + b"%x\r\n" % len(body) + body
                 + b"0\r\n\r\n", E400),
                ("10,000 one-byte chunks", te([b"Transfer-Encoding: chunked"])
                 + b"".join(b"1\r\n" + bytes([ch]) + b"\r\n" for ch in (body + b" " * (10000 - len(body))))
                 + b"0\r\n\r\n", None, 0.3),
                ("leading zeros", te([b"Transfer-Encoding: chunked"]) + b"0" * 30 + b"%x\r\n" % len(body) + body
                 + b"\r\n0\r\n\r\n", None),
                ("bare LF chunk lines", te([b"Transfer-Encoding: chunked"]) + b"%x\n" % len(body) + body
                 + b"\n0\n\n", None)]:
            self.add("chunked", name, data, weight[0] if weight else 1, mode="single", method="POST", creates=True,
                     expect=expect)

    def build_smuggling(self):
        smuggled = self.req("POST", "/v1/jobs", [b"Content-Type: application/json"],
                            jb({"name": "smuggled", "run": OK_RUN}))
        get = b"GET /v1/jobs/smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
        for name, data in [
                ("CL.TE", b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n"
                          % (5 + len(smuggled)) + b"0\r\n\r\n" + smuggled),
                ("TE.CL", b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
                          + b"%x\r\n" % len(smuggled) + smuggled + b"\r\n0\r\n\r\n"),
                ("TE.TE obfuscated", b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked"
                                     b"\r\nTransfer-encoding: x\r\n\r\n" + b"%x\r\n" % len(smuggled) + smuggled
                                     + b"\r\n0\r\n\r\n"),
                ("TE with space before colon", b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                                               b"Transfer-Encoding : chunked\r\n\r\n" % (5 + len(smuggled))
                                               + b"0\r\n\r\n" + smuggled),
                ("TE with tab", b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nTransfer-Encoding:\tchunked"
                                b"\r\n\r\n" % (5 + len(smuggled)) + b"0\r\n\r\n" + smuggled),
                ("TE obs-folded", b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nTransfer-Encoding:\r\n"
                                  b" chunked\r\n\r\n" % (5 + len(smuggled)) + b"0\r\n\r\n" + smuggled),
                ("CL then request in body", b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}" + get),
                ("LF-only header hides a request", b"GET /healthz HTTP/1.1\r\nHost: x\nX: y\r\n\r\n" + get),
                ("CR-only header break", b"GET /healthz HTTP/1.1\r\nHost: x\rContent-Length: 33\r\n\r\n" + get),
                ("GET with CL body holding a request", b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                                                       % len(smuggled) + smuggled),
                ("HTTP/1.0 keep-alive + next", self.req("GET", "/healthz", [b"Connection: keep-alive"],
                                                        version=b"HTTP/1.0") + get),
                ("NUL in header, then request", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX: a\x00\r\n\r\n" + smuggled)]:
            self.add("smuggling", name, data, mode="single", method="POST", creates=True)

    def build_hostile_job(self):
        def job(**kw):
            d = {"name": "h", "run": dict(OK_RUN)}
            d.update(kw)
            return jb(d)

        def env(name, value="1"):
            return jb({"name": "h", "run": {"command": ["true"], "env": {name: value}}})

        for name, body, expect in [
                ("priority 2^64-1", job(priority=UINT64_MAX), E400), ("priority 2^63", job(priority=2 ** 63), E400),
                ("priority -2^63-1", job(priority=-2 ** 63 - 1), E400), ("priority INT64_MIN", job(priority=-2 ** 63), E400),
                ("priority 2^31", job(priority=2 ** 31), E400), ("priority 1000001", job(priority=1000001), E400),
                ("priority 1.5", job(priority=1.5), E400), ("priority \"1\"", job(priority="1"), E400),
                ("priority true", job(priority=True), E400), ("priority null", job(priority=None), E400),
                ("name with newline", job(name="a\nb"), E400),
                ("name forging a log line", job(name="x\n2026-01-01T00:00:00.000 critical: forged by a job name"), E400),
                ("name with CR", job(name="a\rb"), E400), ("name ESC[2J", job(name="\x1b[2J\x1b[H"), E400),
                ("name OSC title", job(name="\x1b]0;owned\x07"), E400), ("name BEL", job(name="\x07"), E400),
                ("name DEL", job(name="a\x7fb"), E400), ("name tab", job(name="a\tb"), E400),
                ("name 257 bytes", job(name="n" * 257), E400), ("name 100 KB", job(name="n" * 100000), E400),
                ("name 86 x 3-byte chars (258 bytes)", job(name="\u20ac" * 86), E400),
                ("name U+0085 NEL", job(name="a\u0085b"), None), ("name U+009B CSI", job(name="\u009b2J"), None),
                ("name U+2028", job(name="a\u2028b"), None), ("name U+202E RTL override", job(name="\u202egnp.exe"), None),
                ("name U+0085 + forged line", job(name="x\u00852026-01-01T00:00:00.000 critical: forged"), None),
                ("name U+2028 + forged line", job(name="x\u20282026-01-01T00:00:00.000 critical: forged"), None),
                ("name empty", job(name=""), None), ("name number", job(name=5), E400),
                ("env \"A B\"", env("A B"), E400), ("env \"A\\nB\"", env("A\nB"), E400), ("env LD_PRELOAD", env("LD_PRELOAD", "/tmp/x.so"), E400),
                ("env BASH_ENV", env("BASH_ENV", "/tmp/x"), E400), ("env LD_AUDIT", env("LD_AUDIT"), E400),
                ("env empty name", env(""), E400), ("env \"=\"", env("="), E400), ("env 1A", env("1A"), E400),
                ("env BASH_FUNC_x%%", env("BASH_FUNC_x%%", "() { :; }"), E400), ("env JOULE_JOB_TOKEN", env("JOULE_JOB_TOKEN"), E400),
                ("env IFS", env("IFS"), E400), ("env PS4", env("PS4", "$(id)"), E400), ("env ENV", env("ENV"), E400),
                ("env SHELLOPTS", env("SHELLOPTS", "xtrace"), E400), ("env GCONV_PATH", env("GCONV_PATH"), E400),
                ("env value with newline", env("A", "x\ny"), None), ("env value 64 KB", env("A", "v" * 65536), None),
                ("env LD_LIBRARY_PATH (allowed)", env("LD_LIBRARY_PATH", "/tmp"), None),
                ("env PATH", env("PATH", "/tmp"), None),
                ("env value not a string", jb({"run": {"command": ["true"], "env": {"A": 1}}}), E400),
                ("env 2,000 entries", jb({"run": {"command": ["true"], "env": {f"V{i}": "1" for i in range(2000)}}}), E400),
                ("argv 5,000 entries", jb({"run": {"command": ["true"] + ["a"] * 5000}}), E400),
                ("argv empty", jb({"run": {"command": []}}), E400), ("argv [\"\"]", jb({"run": {"command": [""]}}), E400),
                ("argv not a list", jb({"run": {"command": "true"}}), E400),
                ("argv nested list", jb({"run": {"command": [["true"]]}}), E400),
                ("workdir relative", jb({"run": {"command": ["true"], "workdir": "../../etc"}}), E400),
                ("workdir /", jb({"run": {"command": ["true"], "workdir": "/"}}), None),
                ("workdir /nonexistent", jb({"run": {"command": ["true"], "workdir": "/nonexistent/x"}}), None),
                ("run unknown field", jb({"run": {"command": ["true"], "shell": True}}), E400),
                ("run builtin", jb({"run": {"builtin": "x"}}), E400),
                ("no run", jb({"name": "x"}), E400), ("body []", b"[]", E400), ("body null", b"null", E400),
                ("body \"\"", b'""', E400), ("empty body", b"", E400), ("body 1", b"1", E400),
                ("duplicate keys", b'{"name":"a","name":"b\\nc","run":{"command":["true"]}}', None),
                ("unknown top-level key", job(nmae="typo"), E400),
                ("deadline 9999-99-99", job(constraints={"deadline": "9999-99-99T99:99:99Z"}), E400),
                ("deadline year 99999999999", job(constraints={"deadline": "99999999999-01-01T00:00:00Z"}), E400),
                ("deadline +99:99", job(constraints={"deadline": "2026-01-01T00:00:00+99:99"}), E400),
                ("deadline year 0", job(constraints={"deadline": "0000-01-01T00:00:00Z"}), None),
                ("deadline 1970", job(constraints={"deadline": "1970-01-01T00:00:00Z"}), None),
                ("devices [\"\\u0000\"]", job(constraints={"devices": ["\u0000"]}), E400),
                ("devices unknown", job(constraints={"devices": ["nope"]}), None),
                ("devices 10,000 entries", job(constraints={"devices": ["cpu"] * 10000}), None),
                ("devices []", job(constraints={"devices": []}), None),
                ("restart bogus", job(restart="always"), E400),
                ("training without model", job(training=TRAINING), None),
                ("model 5,000 layers", job(model={"input": {"shape": [16]}, "layers": [{"type": "relu"}] * 5000},
                                           training=TRAINING), None),
                ("model layers not objects", job(model={"input": {"shape": [16]}, "layers": [1, 2]}), E400)]:
            self.post("hostile-job", name, "/v1/jobs", body, expect=expect)
        # Deep nesting: rare (100-240 KB each), single connection each.
        depth = 100000
        for name, body, target in [
                ("100,000 x [ (unclosed)", b"[" * depth, "/v1/jobs"),
                ("100,000 x [ ] (closed)", b"[" * depth + b"]" * depth, "/v1/jobs"),
                ("40,000 x {\"a\": (closed)", b'{"a":' * 40000 + b"1" + b"}" * 40000, "/v1/jobs"),
                ("model: 100,000 x [", b'{"run":{"command":["true"]},"model":' + b"[" * depth + b"]" * depth + b"}",
                 "/v1/jobs"),
                ("env value: 100,000 x [", b'{"run":{"command":["true"],"env":{"A":' + b"[" * depth + b"]" * depth
                 + b"}}}", "/v1/jobs"),
                ("estimate: 100,000 x [", b'{"model":' + b"[" * depth + b"]" * depth + b"}", "/v1/estimate"),
                ("progress: 100,000 x [", b'{"epoch":' + b"[" * depth + b"]" * depth + b"}",
                 f"/v1/jobs/{self.ctx.job}/progress"),
                ("probes: 100,000 x [", b'{"device":' + b"[" * depth + b"]" * depth + b"}", "/v1/probes")]:
            self.post("hostile-job", name, target, body, weight=0.02, mode="single")

    def build_query(self):
        j = self.ctx.job
        for target, expect in [
                (f"/v1/jobs/{j}/log?tail_bytes=99999999999999", E400), (f"/v1/jobs/{j}/log?tail_bytes=999999999999", None),
                (f"/v1/jobs/{j}/log?tail_bytes=-1", E400), (f"/v1/jobs/{j}/log?tail_bytes=0", None),
                (f"/v1/jobs/{j}/log?tail_bytes=1e3", E400), (f"/v1/jobs/{j}/log?tail_bytes=0x10", E400),
                (f"/v1/jobs/{j}/log?tail_bytes=", E400), (f"/v1/jobs/{j}/log?tail_bytes=18446744073709551615", E400),
                (f"/v1/jobs/{j}/log?tail_bytes=1&tail_bytes=2", None), (f"/v1/jobs/{j}/log?stream=stderr&stream=stdout", None),
                (f"/v1/jobs/{j}/log?stream=../../../../etc/passwd", E400), (f"/v1/jobs/{j}/log?stream=stdin", E400),
                (f"/v1/jobs/{j}/log?stream=stdout%00", E400), (f"/v1/jobs/{j}/log?stream=", E400),
                ("/v1/jobs/nope/log?tail_bytes=99999999999999", None), ("/v1/jobs?limit=-1", E400),
                ("/v1/jobs?limit=0", E400), ("/v1/jobs?limit=99999999999999999999", E400), ("/v1/jobs?limit=1&limit=-1", None),
                ("/v1/jobs?limit=%2b1", E400), ("/v1/jobs?limit=1.5", E400), ("/v1/jobs?limit=", E400), ("/v1/jobs?limit", E400),
                ("/v1/jobs?state=queued&state=bogus", None), ("/v1/jobs?state=", E400), ("/v1/jobs?state=bogus", E400),
                ("/v1/jobs?&&&&&", None), ("/v1/jobs?=", None), ("/v1/jobs?==", None), ("/v1/jobs?limit==1", E400),
                ("/v1/jobs?" + "&".join(f"p{i}=1" for i in range(1500)) + "&limit=1", None),
                ("/v1/jobs?x=" + "y" * 8000 + "&limit=1", None), ("/v1/jobs?limit=100000", None),
                ("/v1/probes?limit=-1", None), ("/metrics?name[]=1&name[]=2", None), ("/healthz?%ff=%ff", E400)]:
            self.add("query", target[:60].replace(j, "ID"), self.req("GET", target), expect=expect,
                     weight=0.05 if "limit=100000" in target else 1)

    def build_auth(self):
        c = self.ctx
        valid_job = jb({"name": "auth", "run": {"command": ["true"], "env": {"HOSTILE_RUN": c.marker}}})
        routes = [("GET", "/v1/jobs?limit=1", None), ("GET", f"/v1/jobs/{c.job}", None),
                  ("GET", f"/v1/jobs/{c.job}/log", None), ("DELETE", "/v1/jobs/nonexistent", None),
                  ("POST", "/v1/jobs", valid_job), ("GET", "/v1/devices", None), ("GET", "/v1/budgets", None),
                  ("GET", "/v1/nodes", None), ("POST", "/v1/estimate", jb({"model": MODEL, "training": TRAINING})),
                  ("GET", "/v1/probes", None), ("POST", f"/v1/jobs/{c.job}/pause", b"{}"),
                  ("POST", "/v1/cluster/sync", b"{}")]
        tok = (c.token or "x").encode()
        # "absent": no bearer token at all. jouled may then identify a loopback client by the
        # user owning its socket ([auth] local_users; root is an admin): refused only where the
        # sender is not root and local_users = "none" (ctx.nonroot). A bearer token that is
        # presented but wrong is refused whoever sends it.
        absent = {"no token", "empty bearer", "Basic"}
        bad = [("no token", None), ("wrong token", b"Bearer wrong"), ("empty bearer", b"Bearer "),
               ("Basic", b"Basic dXNlcjpwYXNz"), ("token \\xff", b"Bearer \xff\xfe"),
               ("16 KB token", b"Bearer " + b"t" * 16000), ("the token's hash as token",
                                                          b"Bearer " + hashlib.sha256(tok).hexdigest().encode()),
               ("token prefix", b"Bearer " + tok[:-1]), ("token + 1 byte", b"Bearer " + tok + b"x")]
        odd = [("lowercase bearer", b"bearer " + tok), ("double space", b"Bearer  " + tok),
               ("trailing space", b"Bearer " + tok + b" ")]
        for method, target, body in routes:
            shown = target.replace(c.job, "ID")
            creates = target == "/v1/jobs"
            for name, header in bad:
                data = self.req(method, target, body=body, token=header if header else False)
                # POST /v1/cluster/sync is refused earlier (not a coordinator): 409 is right there.
                strict = bool(c.token) and (name not in absent or c.nonroot) and target != "/v1/cluster/sync"
                self.add("auth", f"{method} {shown}: {name}", data, method=method, expect=E401 if strict else None,
                         creates=creates and not strict, bypass=strict)
            for name, header in odd:
                self.add("auth", f"{method} {shown}: {name}", self.req(method, target, body=body, token=header),
                         method=method, creates=creates)
            two = [b"Authorization: Bearer " + tok, b"Authorization: Bearer wrong"]
            for name, hs in [("valid then wrong", two), ("wrong then valid", two[::-1])]:
                self.add("auth", f"{method} {shown}: {name}", self.req(method, target, hs, body=body, token=False),
                         method=method, creates=creates)
            self.add("auth", f"{method} {shown}: valid token", self.req(method, target, body=body), method=method,
                     creates=creates)
        for target in ["/healthz", "/readyz", "/metrics"]:
            self.add("auth", f"GET {target}: no token (public)", self.req("GET", target, token=False))
        self.post("auth", "progress with the API token", f"/v1/jobs/{c.job}/progress", b'{"epoch":1,"epochs":2}')

    # --- the plan
    def plan(self, n, rng, hold_max=48):
        """n items, classes drawn by WEIGHTS, variants by weight within each class."""
        classes = [c for c in CLASSES if self.static[c] or self.dynamic[c]]
        weights = [WEIGHTS[c] * (3 if c == "auth" and self.ctx.token else 1) for c in classes]
        tables = {}
        for c in classes:
            entries = [(w, it) for w, it in self.static[c]] + [(w, f) for w, f in self.dynamic[c]]
            tables[c] = ([e[1] for e in entries], [e[0] for e in entries])
        holds = 0
        cls_seq = rng.choices(classes, weights, k=n)
        # every class at least a few times, whatever the draw
        for i, c in enumerate(classes):
            if i * 7 < n:
                cls_seq[i * 7] = c
        for c in cls_seq:
            entries, ws = tables[c]
            for _ in range(10):
                e = rng.choices(entries, ws)[0]
                it = e(rng) if callable(e) else e
                if it.mode == "hold":
                    if holds >= hold_max:
                        continue
                    holds += 1
                break
            yield Item(it.cls, it.variant, it.data, it.mode, it.need, it.method, it.creates, it.expect, it.bypass)


def progress_plan(ctx, n):
    """Progress reports with the running job's own token: past the token check into the checks
    of the numbers themselves."""
    auth = b"Authorization: Bearer " + ctx.job_token.encode()
    target = f"/v1/jobs/{ctx.run_job}/progress".encode()
    bodies = [
        ("overflow", "token: epoch 1e400", b'{"epoch":1e400,"epochs":2}', E400),
        ("overflow", "token: epochs -1e400", b'{"epoch":1,"epochs":-1e400}', E400),
        ("overflow", "token: epoch 2^64-1", jb({"epoch": UINT64_MAX, "epochs": 10}), E400),
        ("overflow", "token: epoch INT64_MAX", jb({"epoch": INT64_MAX, "epochs": 1000000}), E400),
        ("overflow", "token: epochs INT64_MAX", jb({"epoch": 1, "epochs": INT64_MAX}), E400),
        ("overflow", "token: epochs 1000001", jb({"epoch": 1, "epochs": 1000001}), E400),
        ("overflow", "token: epoch 2^31", jb({"epoch": 2 ** 31, "epochs": 1000000}), E400),
        ("overflow", "token: epoch 1.5", b'{"epoch":1.5,"epochs":2}', E400),
        ("overflow", "token: epoch 1e308", b'{"epoch":1e308,"epochs":2}', E400),
        ("overflow", "token: epoch -1", b'{"epoch":-1,"epochs":2}', E400),
        ("overflow", "token: epoch 0", b'{"epoch":0,"epochs":2}', E400),
        ("overflow", "token: body []", b"[]", E400),
        ("json-utf8", "token: epoch \"\\xff\"", b'{"epoch":"\xff","epochs":2}', E400),
        ("json-utf8", "token: member \"\\xff\"", b'{"\xff":1,"epoch":1,"epochs":2}', E400),
        ("json-utf8", "token: epoch \"\\u0000\"", b'{"epoch":"\\u0000","epochs":2}', E400)]
    items = []
    epoch = 0
    for i in range(n):
        if i % 4 == 3:
            epoch += 1
            body = jb({"epoch": epoch, "epochs": 1000000})
            items.append(Item("overflow", "token: valid epoch k of 1,000,000", b"POST " + target + b" HTTP/1.1\r\nHost: x\r\n"
                              + auth + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body, method="POST"))
            continue
        cls, name, body, expect = bodies[i % len(bodies)]
        items.append(Item(cls, name, b"POST " + target + b" HTTP/1.1\r\nHost: x\r\n" + auth
                          + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body, method="POST", expect=expect))
    return iter(items)


# ------------------------------------------------------------------ the attack engine (asyncio)


class BadResponse(Exception):
    pass


class Response:
    __slots__ = ("status", "headers", "body", "head")

    def __init__(self, status, headers, body, head):
        self.status, self.headers, self.body, self.head = status, headers, body, head

    def closes(self):
        conn = self.headers.get("connection", "").lower()
        return "close" in conn or (self.head.startswith(b"HTTP/1.0") and "keep-alive" not in conn)


async def read_response(reader, method, timeout, head_probe=False):
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise BadResponse(f"partial answer {e.partial[:80]!r}")
        raise
    except asyncio.LimitOverrunError:
        raise BadResponse("answer head over 2 MB")
    while re.match(rb"HTTP/1\.[01] 1(0[02-9]|[1-9]\d) ", head):  # interim answers (100 Continue): the next one counts
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    lines = head[:-4].split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise BadResponse(f"not an HTTP status line: {lines[0][:80]!r}")
    status = int(parts[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        headers[k.strip().lower().decode("latin-1")] = v.strip().decode("latin-1")
    if (method == "HEAD" and not head_probe) or status < 200 or status in (204, 304):
        body = b""
    elif "chunked" in headers.get("transfer-encoding", "").lower():
        chunks = []
        while True:
            size_line = await asyncio.wait_for(reader.readuntil(b"\r\n"), timeout)
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await asyncio.wait_for(reader.readuntil(b"\r\n"), timeout)
                break
            chunks.append(await asyncio.wait_for(reader.readexactly(size + 2), timeout))
        body = b"".join(c[:-2] for c in chunks)
    elif "content-length" in headers:
        n = int(headers["content-length"])
        if head_probe:
            try:
                body = await asyncio.wait_for(reader.readexactly(n), min(timeout, 2.0))
            except (asyncio.IncompleteReadError, asyncio.TimeoutError) as e:
                body = getattr(e, "partial", b"")
        else:
            body = await asyncio.wait_for(reader.readexactly(n), timeout)
    else:
        body = await asyncio.wait_for(reader.read(), timeout)
    return Response(status, headers, body, head)


class ClassStats:
    def __init__(self):
        self.sent = 0
        self.codes = collections.Counter()
        self.no_answer = 0
        self.no_answer_pipe = 0
        self.resets = 0
        self.timeouts = 0
        self.connect_failed = 0
        self.bad_response = 0
        self.ctype = 0
        self.body = 0
        self.mismatch = 0
        self.unexpected = collections.Counter()
        self.extra = 0
        self.head_body = 0
        self.bypass = 0
        self.examples = []
        self.no_answer_variants = collections.Counter()
        self.variant_codes = collections.defaultdict(collections.Counter)
        self.variant_expect = {}

    def answered(self):
        return sum(self.codes.values())

    FIELDS = ("sent", "no_answer", "no_answer_pipe", "resets", "timeouts", "connect_failed", "bad_response", "ctype",
              "body", "mismatch", "extra", "head_body", "bypass", "examples")

    def to_dict(self):
        d = {f: getattr(self, f) for f in self.FIELDS}
        d["codes"] = dict(self.codes)
        d["unexpected"] = [[v, code, n] for (v, code), n in self.unexpected.items()]
        d["no_answer_variants"] = dict(self.no_answer_variants)
        d["variant_codes"] = {v: dict(c) for v, c in self.variant_codes.items()}
        d["variant_expect"] = {v: sorted(e) if e is not None else None for v, e in self.variant_expect.items()}
        return d

    @classmethod
    def from_dict(cls, d):
        s = cls()
        for f in cls.FIELDS:
            setattr(s, f, d[f])
        s.codes = collections.Counter({int(k): n for k, n in d["codes"].items()})
        s.unexpected = collections.Counter({(v, code): n for v, code, n in d["unexpected"]})
        s.no_answer_variants = collections.Counter(d["no_answer_variants"])
        for v, c in d["variant_codes"].items():
            s.variant_codes[v] = collections.Counter({int(k): n for k, n in c.items()})
        s.variant_expect = {v: frozenset(e) if e is not None else None for v, e in d["variant_expect"].items()}
        return s


class Engine:
    def __init__(self, run, recent):
        self.run = run
        self.port = run.daemon.port
        self.recent = recent
        self.stats = collections.defaultdict(ClassStats)
        self.created_ids = set()
        self.created = 0
        self.uncertain = 0
        self.deadline = run.deadline
        self.src_index = 0
        base = ARGS.attacker_source.split(".")
        self.sources = [".".join(base[:3] + [str(int(base[3]) + i)]) for i in range(8)]
        self.hold_sem = None
        self.hold_tasks = set()
        self.hold_lifetimes = []
        self.plan = iter(())
        self.flood_seconds = 0.0  # the workers' time, without the wait for truncated requests left open

    # --- sockets
    async def connect(self, source=None, tries=150):
        for _ in range(tries):
            if time.monotonic() > self.deadline:
                return None
            try:
                r, w = await asyncio.wait_for(asyncio.open_connection(
                    "127.0.0.1", self.run.daemon.port, limit=1 << 21, local_addr=(source or self.sources[0], 0)), 5)
                sock = w.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return r, w, time.monotonic()
            except (OSError, asyncio.TimeoutError):
                await asyncio.sleep(0.2)
        return None

    def note_sent(self, item):
        self.recent.append((time.monotonic(), item.cls, item.variant, item.data))

    # --- bookkeeping
    def record(self, item, resp, why=None, pipe=False):
        s = self.stats[item.cls]
        s.sent += 1
        if resp is None:
            if why == "timeout":
                s.timeouts += 1
            elif why == "connect":
                s.connect_failed += 1
            elif why == "bad":
                s.bad_response += 1
            else:
                s.no_answer += 1
                if why == "reset":
                    s.resets += 1
                if pipe:
                    s.no_answer_pipe += 1
                s.no_answer_variants[item.variant] += 1
            if item.creates and why != "connect":
                self.uncertain += 1
            return
        self.check_answer(item, resp, s)
        s.variant_codes[item.variant][resp.status] += 1
        s.variant_expect[item.variant] = item.expect
        if item.expect is not None and resp.status not in item.expect:
            s.unexpected[(item.variant, resp.status)] += 1
        if item.bypass and 200 <= resp.status < 300:
            s.bypass += 1
            self.example(s, item, resp, "served without a valid token")

    def check_answer(self, item, resp, s):
        s.codes[resp.status] += 1
        if resp.status == 201:
            self.created += 1
            try:
                self.created_ids.add(json.loads(resp.body)["id"])
            except (ValueError, KeyError, TypeError):
                self.example(s, item, resp, "201 without a job id")
        if resp.status >= 400:
            if not resp.headers.get("content-type", "").startswith("application/problem+json"):
                s.ctype += 1
                self.example(s, item, resp, "4xx/5xx without application/problem+json")
            if item.method != "HEAD":
                try:
                    doc = json.loads(resp.body)
                    ok = isinstance(doc, dict) and "status" in doc
                except ValueError:
                    ok, doc = False, None
                if not ok:
                    s.body += 1
                    self.example(s, item, resp, "problem body is not JSON with a status")
                elif doc["status"] != resp.status:
                    s.mismatch += 1
                    self.example(s, item, resp, "status in the body differs")
        if resp.status >= 500:
            self.example(s, item, resp, "5xx")

    def example(self, s, item, resp, what):
        if len(s.examples) < 6:
            s.examples.append({"what": what, "variant": item.variant, "request": repr(item.data[:300]),
                               "answer": repr((resp.head + resp.body)[:300]) if resp else None})

    # --- the flood
    def take(self):
        return next(self.plan, None)

    async def worker(self, wid):
        conn = None
        retry = collections.deque()
        pending = None
        source = self.sources[wid % 4]
        while time.monotonic() < self.deadline:
            batch = []
            while len(batch) < ARGS.pipeline:
                if retry:
                    batch.append(retry.popleft())
                    continue
                it = self.take()
                if it is None:
                    break
                if it.mode != "pipe":
                    pending = it
                    break
                batch.append(it)
            if batch:
                conn = await self.send_batch(conn, batch, retry, source)
            if pending is not None:
                it, pending = pending, None
                if it.mode == "hold":
                    await self.hold_sem.acquire()
                    t = asyncio.ensure_future(self.hold(it, source))
                    self.hold_tasks.add(t)
                    t.add_done_callback(lambda t: (self.hold_sem.release(), self.hold_tasks.discard(t)))
                else:
                    await self.solo(it, source)
            elif not batch:
                break
        if conn:
            conn[1].transport.abort()

    async def send_batch(self, conn, batch, retry, source):
        if conn is not None and time.monotonic() - conn[2] > 1.0:
            # Idle while this worker sent requests of its own connection: jouled may be closing it
            # (idle timeout) as the batch goes out; a client would reconnect rather than race that.
            conn[1].transport.abort()
            conn = None
        if conn is None:
            conn = await self.connect(source)
            if conn is None:
                for it in batch:
                    self.record(it, None, "connect")
                return None
        r, w, _ = conn
        for it in batch:
            self.note_sent(it)
        try:
            w.write(b"".join(it.data for it in batch))
            await asyncio.wait_for(w.drain(), 20)
        except (OSError, asyncio.TimeoutError):
            pass  # the answers read below say what was taken

        def requeue(rest):
            for it in rest:
                it.tries += 1
                if it.tries > 3:
                    self.record(it, None, "closed", pipe=True)
                else:
                    retry.append(it)

        for i, it in enumerate(batch):
            try:
                resp = await read_response(r, it.method, 20)
            except asyncio.TimeoutError:
                self.record(it, None, "timeout", pipe=True)
            except BadResponse as e:
                self.record(it, None, "bad", pipe=True)
                s = self.stats[it.cls]
                if len(s.examples) < 6:
                    s.examples.append({"what": "unparseable answer: " + str(e), "variant": it.variant,
                                       "request": repr(it.data[:300]), "answer": None})
            except ConnectionResetError:
                self.record(it, None, "reset", pipe=True)
            except (asyncio.IncompleteReadError, OSError):
                self.record(it, None, "closed", pipe=True)
            else:
                self.record(it, resp, pipe=True)
                if not resp.closes():
                    continue
                requeue(batch[i + 1:])
                w.transport.abort()
                return None
            requeue(batch[i + 1:])
            w.transport.abort()
            return None
        return r, w, time.monotonic()

    async def solo(self, it, source):
        conn = await self.connect(source)
        if conn is None:
            self.record(it, None, "connect")
            return
        r, w, _ = conn
        self.note_sent(it)
        try:
            w.write(it.data)
            await asyncio.wait_for(w.drain(), 10)
            w.write_eof()
        except (OSError, asyncio.TimeoutError):
            pass
        answers, why = [], "closed"
        while len(answers) < 8:
            try:
                resp = await read_response(r, it.method, 10 if not answers else 1.5, head_probe=it.method == "HEAD")
                answers.append(resp)
                if it.method == "HEAD" and resp.body:
                    self.stats[it.cls].head_body += 1
            except asyncio.TimeoutError:
                why = "timeout" if not answers else None
                break
            except BadResponse as e:
                why = "bad"
                s = self.stats[it.cls]
                if len(s.examples) < 6:
                    s.examples.append({"what": "unparseable answer: " + str(e), "variant": it.variant,
                                       "request": repr(it.data[:300]), "answer": None})
                break
            except ConnectionResetError:
                why = "reset"
                break
            except (asyncio.IncompleteReadError, OSError):
                why = "closed"
                break
        w.transport.abort()
        if not answers:
            if it.need or why in ("timeout", "bad"):
                self.record(it, None, why)
            else:
                self.record(it, None, "closed-ok")
        else:
            self.record(it, answers[0])
            for extra in answers[1:]:
                self.stats[it.cls].extra += 1
                self.check_answer(it, extra, self.stats[it.cls])

    async def hold(self, it, source):
        conn = await self.connect(source)
        if conn is None:
            self.record(it, None, "connect")
            return
        r, w, _ = conn
        self.note_sent(it)
        t0 = time.monotonic()
        try:
            w.write(it.data)
            resp = await read_response(r, it.method, ARGS.request_timeout + 15)
            self.record(it, resp)
        except asyncio.TimeoutError:
            self.record(it, None, "timeout")
        except (asyncio.IncompleteReadError, OSError, BadResponse):
            self.record(it, None, "closed-ok")
        self.hold_lifetimes.append(time.monotonic() - t0)
        w.transport.abort()

    async def flood(self, plan):
        self.plan = plan
        self.hold_sem = asyncio.Semaphore(8)
        t0 = time.monotonic()
        await asyncio.gather(*[self.worker(i) for i in range(ARGS.connections)])
        self.flood_seconds += time.monotonic() - t0
        if self.hold_tasks:
            await asyncio.wait(list(self.hold_tasks), timeout=ARGS.request_timeout + 20)

    # --- connection abuse
    async def probe_loop(self, log, stop):
        """GET /healthz on a fresh connection from 127.0.0.1 every 0.25 s."""
        while not stop.is_set() and time.monotonic() < self.deadline:
            t0 = time.monotonic()
            ok, status = False, None
            try:
                r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.run.daemon.port,
                                                                      local_addr=("127.0.0.1", 0)), 3)
                try:
                    w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    resp = await read_response(r, "GET", 3)
                    status = resp.status
                    ok = resp.status == 200
                finally:
                    w.transport.abort()
            except Exception:  # a refusal of any kind is the figure
                pass
            log.append((self.run.phase, t0, ok, status, (time.monotonic() - t0) * 1000))
            await asyncio.sleep(max(0.0, 0.25 - (time.monotonic() - t0)))

    async def idle_hold(self, name, n, seconds, sources):
        """n connections that never send a byte, reopened as soon as jouled closes one."""
        end = time.monotonic() + seconds
        st = {"opened": 0, "busy_503": 0, "closed_fast": 0, "closed_by_server": 0, "held_to_end": 0,
              "lifetimes": [], "connect_failed": 0}

        async def slot(i):
            src = sources[i % len(sources)]
            while time.monotonic() < end - 0.05:
                try:
                    r, w = await asyncio.wait_for(asyncio.open_connection(
                        "127.0.0.1", self.run.daemon.port, local_addr=(src, 0)), 2)
                except (OSError, asyncio.TimeoutError):
                    st["connect_failed"] += 1
                    await asyncio.sleep(0.1)
                    continue
                w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                st["opened"] += 1
                self.stats[name].sent += 1
                t0 = time.monotonic()
                try:
                    data = await asyncio.wait_for(r.read(4096), max(0.01, end - time.monotonic()))
                    life = time.monotonic() - t0
                    st["lifetimes"].append(life)
                    st["closed_by_server"] += 1
                    if data.startswith(b"HTTP/1.1 503"):
                        st["busy_503"] += 1
                        self.stats[name].codes[503] += 1
                        if b"application/problem+json" not in data:
                            self.stats[name].ctype += 1
                    elif data:
                        self.stats[name].codes[int(data[9:12]) if data[9:12].isdigit() else 0] += 1
                    else:
                        self.stats[name].no_answer += 1
                    if life < 0.2:
                        st["closed_fast"] += 1
                        await asyncio.sleep(0.05)
                except asyncio.TimeoutError:
                    st["held_to_end"] += 1
                except OSError:
                    st["closed_by_server"] += 1
                    self.stats[name].no_answer += 1
                w.transport.abort()

        await asyncio.gather(*[slot(i) for i in range(n)])
        return st

    async def slowloris(self, name, n, seconds, sources):
        """n connections sending a request's headers one byte a second, never finishing them."""
        end = time.monotonic() + seconds
        st = {"opened": 0, "lifetimes": [], "bytes": 0, "held_to_end": 0, "answered": 0}
        trickle = b"X-Slow: " + b"a" * 100000

        async def slot(i):
            src = sources[i % len(sources)]
            while time.monotonic() < end - 0.05:
                try:
                    r, w = await asyncio.wait_for(asyncio.open_connection(
                        "127.0.0.1", self.run.daemon.port, local_addr=(src, 0)), 2)
                except (OSError, asyncio.TimeoutError):
                    await asyncio.sleep(0.1)
                    continue
                w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                st["opened"] += 1
                self.stats[name].sent += 1
                t0 = time.monotonic()
                closed = False
                try:
                    w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                    k = 0
                    while time.monotonic() < end and k < len(trickle):
                        try:
                            data = await asyncio.wait_for(r.read(4096), 1.0)
                            closed = True
                            if data:
                                st["answered"] += 1
                                self.stats[name].codes[int(data[9:12]) if data[9:12].isdigit() else 0] += 1
                            else:
                                self.stats[name].no_answer += 1
                            break
                        except asyncio.TimeoutError:
                            w.write(trickle[k:k + 1])
                            st["bytes"] += 1
                            k += 1
                except OSError:
                    closed = True
                    self.stats[name].no_answer += 1
                if closed:
                    st["lifetimes"].append(time.monotonic() - t0)
                else:
                    st["held_to_end"] += 1
                w.transport.abort()

        await asyncio.gather(*[slot(i) for i in range(n)])
        return st

    async def slow_read(self, name, n, seconds, source):
        """n connections that pipeline 200 big GETs each and never read an answer."""
        st = {"connections": n, "requests": 0, "closed_by_server": 0, "reset_by_server": 0, "bytes_read_at_end": 0}
        conns = []
        req = b"GET /v1/jobs?limit=100000 HTTP/1.1\r\nHost: x\r\n"
        if self.run.token:
            req += b"Authorization: Bearer " + self.run.token.encode() + b"\r\n"
        req += b"\r\n"
        for _ in range(n):
            try:
                r, w = await asyncio.wait_for(asyncio.open_connection(
                    "127.0.0.1", self.run.daemon.port, local_addr=(source, 0)), 2)
            except (OSError, asyncio.TimeoutError):
                continue
            w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            w.transport.pause_reading()
            w.write(req * 200)
            st["requests"] += 200
            self.stats[name].sent += 200
            conns.append((r, w))
        await asyncio.sleep(seconds)
        for r, w in conns:
            w.transport.resume_reading()
            got = 0
            stop_at = time.monotonic() + 3
            try:
                while time.monotonic() < stop_at:
                    data = await asyncio.wait_for(r.read(1 << 20), 0.5)
                    if not data:
                        st["closed_by_server"] += 1
                        break
                    got += len(data)
            except asyncio.TimeoutError:
                pass
            except OSError:
                st["closed_by_server"] += 1
                st["reset_by_server"] += 1
            st["bytes_read_at_end"] += got
            w.transport.abort()
        return st


# ------------------------------------------------------------------ the token checks as another user


def auth_probe_main(port, token, job, n):
    """Child process, already running as --nonroot-uid: every token variant of the auth class,
    n requests in all, each that is not a valid token expected to be refused (401). Prints the
    class's figures as JSON."""

    class Shim:
        pass

    run = Shim()
    run.daemon = Shim()
    run.daemon.port = int(port)
    run.deadline = time.monotonic() + 300
    run.token = token
    run.phase = "auth-nonroot"
    ctx = Ctx()
    ctx.token, ctx.job, ctx.max_body, ctx.marker = token, job, ARGS.max_body, "nonroot"
    ctx.run_job, ctx.job_token, ctx.nonroot = None, None, True
    variants = [it for _, it in Catalog(ctx).static["auth"]]
    n = int(n)
    plan = (Item("auth-nonroot", it.variant, it.data, it.mode, it.need, it.method, it.creates, it.expect, it.bypass)
            for it in (variants[i % len(variants)] for i in range(n)))
    engine = Engine(run, collections.deque(maxlen=1))
    asyncio.run(engine.flood(plan))
    out = {"uid": os.getuid(), "classes": {c: s.to_dict() for c, s in engine.stats.items()},
           "created_ids": sorted(engine.created_ids), "uncertain": engine.uncertain}
    sys.stdout.write(json.dumps(out))
    return 0


def run_auth_probe(run, job, n):
    """Runs auth_probe_main as --nonroot-uid (a copy of this script in the run's dir, the system
    python3: /root is closed to other users). Returns its JSON, or None with a note."""
    script = os.path.join(run.dir, "hostile_client.py")
    shutil.copy2(os.path.abspath(__file__), script)
    os.chmod(script, 0o644)
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    kw = {}
    if os.geteuid() == 0:
        kw = {"user": ARGS.nonroot_uid, "group": ARGS.nonroot_uid, "extra_groups": []}
    try:
        done = subprocess.run([python, script, "--attacker-source", ARGS.attacker_source, "--max-body", str(ARGS.max_body),
                               "--auth-probe", str(run.daemon.port), run.token, job, str(n)],
                              capture_output=True, timeout=360, cwd="/", **kw)
        if done.returncode != 0:
            return None, f"exit {done.returncode}: {done.stderr.decode('utf-8', 'replace')[-500:]}"
        return json.loads(done.stdout), None
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return None, str(e)


# ------------------------------------------------------------------ one run


class Ctx:
    pass


class Run:
    def __init__(self, name, requests, auth):
        self.name = name
        self.requests = requests
        self.token = uuid.uuid4().hex if auth else None
        self.dir = tempfile.mkdtemp(prefix=f"joule-hostile-{name}-")
        os.chmod(self.dir, 0o711)  # jobs run as accounts of their own; their directory is under this one
        self.marker = uuid.uuid4().hex
        self.binary = os.path.join(self.dir, "jouled")
        shutil.copy2(ARGS.jouled, self.binary)
        self.children = []
        self.phase = "setup"
        self.phases = []
        self.phase_rss = []  # (phase that ends, VmRSS kB then)
        self.deadline = WATCHDOG_END
        self.daemon = None
        self.cleaned = False
        RUNS.append(self)

    def set_phase(self, name):
        now = time.monotonic()
        if self.daemon and self.daemon.alive():
            self.phase_rss.append((self.phase, self.daemon.rss_kb()))
        if self.phases:
            self.phases[-1][2] = now
        self.phases.append([name, now, None])
        self.phase = name
        print(f"[{self.name}] {name}  (load {loadavg()})", flush=True)

    def config(self):
        lines = ["[server]", f"max_body_bytes = {ARGS.max_body}", f"request_timeout_seconds = {ARGS.request_timeout}",
                 f"max_connections = {ARGS.max_connections}", "max_queued_jobs = 1000000"]
        if ARGS.idle_timeout > 0:
            lines.append(f"idle_timeout_seconds = {ARGS.idle_timeout}")
        if ARGS.max_per_client > 0:
            lines.append(f"max_connections_per_client = {ARGS.max_per_client}")
        lines += ["[log]", 'level = "info"', "[probing]", "enabled = false", "[[devices]]", 'name = "cpu"',
                  'meter = "modelled"']
        if self.token:
            # local_users = "none": a loopback client without a token is refused unless it is root or
            # jouled's own user (keys a jouled does not know are warnings only).
            lines += ["[auth]", f'token_sha256 = ["{hashlib.sha256(self.token.encode()).hexdigest()}"]',
                      'local_users = "none"']
        return "\n".join(lines) + "\n"

    def job_pids(self):
        needle = ("HOSTILE_RUN=" + self.marker).encode()
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/environ", "rb") as f:
                        if needle in f.read():
                            out.append(int(entry))
                except OSError:
                    pass
        return out

    def cleanup(self):
        if self.cleaned:
            return
        self.cleaned = True
        for p in self.children:
            if p.poll() is None:
                p.kill()
                p.wait()
        if self.daemon:
            self.daemon.stop()
        for pid in self.job_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if ARGS.keep:
            print(f"[{self.name}] kept {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def api(run, method, path, body=None, timeout=15):
    return call(run.daemon.port, method, path, body=body, token=run.token, timeout=timeout)


def wait_state(run, job_id, states, seconds):
    end = time.monotonic() + seconds
    state = None
    while time.monotonic() < end:
        try:
            status, doc, _ = api(run, "GET", f"/v1/jobs/{job_id}")
            state = doc.get("state") if isinstance(doc, dict) else None
            if state in states:
                return state
        except OSError:
            pass
        time.sleep(0.2)
    return state


def latency_summary(rows, t0, t1):
    out = {}
    for kind in ("healthz", "submit"):
        sel = [r for r in rows if r["kind"] == kind and t0 <= r["t"] < t1]
        good = [r["ms"] for r in sel if r["status"] in (200, 201)]
        fails = [r for r in sel if r["status"] not in (200, 201)]
        out[kind] = {"n": len(sel), "p50": pct(good, 50), "p99": pct(good, 99), "max": max(good) if good else float("nan"),
                     "failed": len(fails),
                     "fail_kinds": collections.Counter((r["err"] or str(r["status"])).split(":")[0] for r in fails)}
    return out


def log_check(paths):
    bad, ctrl, lines_total, size = [], [], 0, 0
    for p in paths:
        with open(p, "rb") as f:
            data = f.read()
        size += len(data)
        for line in data.split(b"\n"):
            if not line:
                continue
            lines_total += 1
            if not LOG_LINE.match(line):
                bad.append(line)
            body = line
            if any(b < 0x20 and b != 0x09 or b == 0x7F for b in body):
                ctrl.append(line)
            else:
                try:
                    text = body.decode("utf-8")
                    if any(0x80 <= ord(ch) <= 0x9F or ch in "\u2028\u2029" for ch in text):
                        ctrl.append(line)
                except UnicodeDecodeError:
                    ctrl.append(line)
    return {"lines": lines_total, "bytes": size, "unprefixed": len(bad), "unprefixed_examples": [repr(l[:200]) for l in bad[:5]],
            "control_or_bad_utf8": len(ctrl), "control_examples": [repr(l[:200]) for l in ctrl[:5]]}


def isolate(run, monitor, crash, limit=200):
    """Replays the requests sent in the seconds before a crash, newest first, one per fresh
    connection, until one kills jouled: that one is the reproducer."""
    seen, suspects = set(), []
    for t, cls, variant, data in reversed(crash["suspects"]):
        if data not in seen:
            seen.add(data)
            suspects.append((cls, variant, data))
    monitor.auto_restart = False
    try:
        for cls, variant, data in suspects[:limit]:
            with run.daemon.lock:
                if not run.daemon.alive():
                    run.daemon.start()
            try:
                s = socket.create_connection(("127.0.0.1", run.daemon.port), timeout=3)
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)
                s.settimeout(3)
                while s.recv(65536):
                    pass
            except OSError:
                pass
            finally:
                try:
                    s.close()
                except Exception:
                    pass
            time.sleep(0.3)
            if not run.daemon.alive():
                path = os.path.join(ARGS.repro_dir, f"jouled-repro-{run.name}-{len(monitor.crashes)}-{int(time.time())}.bin")
                with open(path, "wb") as f:
                    f.write(data)
                code = run.daemon.proc.returncode
                run.daemon.start()
                return {"class": cls, "variant": variant, "bytes": repr(data[:600]), "file": path, "exit": code}
        return None
    finally:
        monitor.auto_restart = True


def run_once(name, requests, auth, rng):
    run = Run(name, requests, auth)
    result = {"name": name, "requests_planned": requests, "auth": auth}
    try:
        result["load_start"] = loadavg()
        run.daemon = Daemon(run, run.config())
        run.daemon.start()
        print(f"[{name}] jouled pid {run.daemon.proc.pid} on 127.0.0.1:{run.daemon.port}; temp dir {run.dir}", flush=True)
        recent = collections.deque(maxlen=512)
        monitor = Monitor(run.daemon, recent)
        monitor.start()
        created_ids = set()

        # a finished job for ids in the queries
        status, doc, _ = api(run, "POST", "/v1/jobs", {"name": "seed", "run": {"command": ["true"],
                                                                                "env": {"HOSTILE_RUN": run.marker}}})
        if status != 201:
            raise RuntimeError(f"seed job refused: {status} {doc}")
        seed = doc["id"]
        created_ids.add(seed)
        wait_state(run, seed, ("succeeded", "failed"), 30)

        run.set_phase("baseline")
        vc = ValidClient(run, name + "-baseline", ARGS.baseline_seconds * (1 if not auth else 0.5))
        vc.proc.wait(timeout=ARGS.baseline_seconds + 60)
        base_rows = vc.finish()
        created_ids |= {r["id"] for r in base_rows if r["id"]}
        result["rss_before_kb"] = run.daemon.rss_kb()

        # a running job and its own token, for progress reports past the token check
        status, doc, _ = api(run, "POST", "/v1/jobs", {"name": "progress-target", "run": {
            "command": ["sh", "-c", 'printf %s "$JOULE_JOB_TOKEN"; exec sleep 300'],
            "env": {"HOSTILE_RUN": run.marker}}})
        ctx = Ctx()
        ctx.token, ctx.job, ctx.max_body, ctx.marker = run.token, seed, ARGS.max_body, run.marker
        ctx.run_job, ctx.job_token, ctx.nonroot = None, None, False
        if status == 201:
            created_ids.add(doc["id"])
            if wait_state(run, doc["id"], ("running",), 30) == "running":
                end = time.monotonic() + 10
                while time.monotonic() < end and not ctx.job_token:
                    s2, text, _ = api(run, "GET", f"/v1/jobs/{doc['id']}/log?stream=stdout")
                    if s2 == 200 and isinstance(text, str) and len(text.strip()) >= 16:
                        ctx.job_token = text.strip()
                    time.sleep(0.2)
                ctx.run_job = doc["id"]
        print(f"[{name}] progress target {ctx.run_job}: token {'read' if ctx.job_token else 'NOT read'}", flush=True)

        catalog = Catalog(ctx)
        vc = ValidClient(run, name + "-attack", 3600)
        engine = Engine(run, recent)
        n_progress = min(2000, requests // 50) if ctx.job_token else 0
        conn_abuse = {}
        probes = []

        async def attack():
            stop = asyncio.Event()
            prober = asyncio.ensure_future(engine.probe_loop(probes, stop))
            run.set_phase("flood")
            t0 = time.monotonic()
            if n_progress:
                await engine.flood(progress_plan(ctx, n_progress))
                if ctx.run_job:
                    await asyncio.get_running_loop().run_in_executor(None, api, run, "DELETE", f"/v1/jobs/{ctx.run_job}")
            await engine.flood(catalog.plan(requests - n_progress, rng))
            result["flood_seconds"] = engine.flood_seconds
            result["flood_wall_seconds"] = time.monotonic() - t0
            if not ARGS.no_conn_abuse and not auth:
                secs = ARGS.abuse_seconds or 2 * ARGS.request_timeout + 2
                many = engine.sources[1:]
                run.set_phase("idle-1src")
                conn_abuse["idle-1src"] = await engine.idle_hold("idle-1src", 2 * ARGS.max_connections, secs,
                                                                 [engine.sources[0]])
                run.set_phase("idle-nsrc")
                conn_abuse["idle-nsrc"] = await engine.idle_hold("idle-nsrc", 2 * ARGS.max_connections, secs, many)
                run.set_phase("slowloris")
                conn_abuse["slowloris"] = await engine.slowloris("slowloris", ARGS.max_connections, secs, many)
                run.set_phase("slow-read")
                conn_abuse["slow-read"] = await engine.slow_read("slow-read", 8, secs, engine.sources[0])
            if auth:
                run.set_phase("auth-nonroot")
                probe, note = await asyncio.get_running_loop().run_in_executor(
                    None, run_auth_probe, run, seed, max(500, requests // 10))
                result["auth_nonroot"] = {"uid": probe["uid"] if probe else None, "note": note}
                if probe:
                    for c, d in probe["classes"].items():
                        engine.stats[c] = ClassStats.from_dict(d)
                    engine.created_ids |= set(probe["created_ids"])
                    engine.uncertain += probe["uncertain"]
                    if probe["uid"] == 0:
                        result["auth_nonroot"]["note"] = "ran as root: token-less requests are an admin's"
                print(f"[{name}] token checks as uid {result['auth_nonroot']['uid']}: "
                      f"{note or 'done'}", flush=True)
            run.set_phase("after")
            await asyncio.sleep(5)
            stop.set()
            await prober

        asyncio.run(attack())
        run.set_phase("checks")
        attack_rows = vc.finish()
        created_ids |= {r["id"] for r in attack_rows if r["id"]}
        created_ids |= engine.created_ids

        # crashes: find the request that kills it
        repros = []
        for crash in list(monitor.crashes)[:3]:
            print(f"[{name}] isolating crash at {crash['last_class']} / {crash['last_variant']} "
                  f"({len(crash['suspects'])} suspects)", flush=True)
            repros.append(isolate(run, monitor, crash))

        # let the queue drain (valid jobs ran `true`), then compare what is stored with the 201s
        end = time.monotonic() + 120
        while time.monotonic() < end:
            try:
                busy = sum(api(run, "GET", f"/v1/jobs?state={s}&limit=1")[1].get("total", 0)
                           for s in ("queued", "placed", "running", "throttled"))
            except (OSError, AttributeError):
                busy = -1
            if busy == 0:
                break
            time.sleep(1)
        # Every stored job, page after page (at most 1,000 a page; a larger limit is a 400).
        t_list = time.monotonic()
        stored, list_bytes, target = set(), 0, "/v1/jobs?limit=1000"
        while True:
            status, listing, _ = api(run, "GET", target, timeout=60)
            if not isinstance(listing, dict):
                break
            list_bytes += len(json.dumps(listing))
            stored |= {j["id"] for j in listing.get("jobs", [])}
            if not listing.get("next"):
                break
            target = "/v1/jobs?limit=1000&after=" + listing["next"]
        list_ms = (time.monotonic() - t_list) * 1000
        time.sleep(1)
        monitor.stop_flag.set()
        monitor.join()
        rss_final = run.daemon.rss_kb()
        alive_at_end = run.daemon.alive()
        run.daemon.stop()
        result["load_end"] = loadavg()

        # figures
        result["crashes"] = [{k: v for k, v in c.items() if k != "suspects"} for c in monitor.crashes]
        result["repros"] = repros
        result["alive_at_end"] = alive_at_end
        result["dead_samples"] = monitor.dead_samples
        rss = [r for _, r in monitor.samples]
        result["rss_kb"] = {"before": result["rss_before_kb"], "max": max(rss) if rss else None, "final": rss_final,
                            "samples": len(rss), "at_phase_end": run.phase_rss}
        stats = engine.stats
        result["classes"] = {c: {"sent": s.sent, "answered": s.answered(), "codes": dict(sorted(s.codes.items())),
                                 "no_answer": s.no_answer, "no_answer_pipelined": s.no_answer_pipe, "resets": s.resets,
                                 "timeouts": s.timeouts, "connect_failed": s.connect_failed,
                                 "bad_response": s.bad_response, "ctype_violations": s.ctype,
                                 "body_violations": s.body, "status_mismatch": s.mismatch, "extra_answers": s.extra,
                                 "head_with_body": s.head_body, "auth_bypass": s.bypass,
                                 "unexpected": {f"{v} -> {code}": n for (v, code), n in
                                                s.unexpected.most_common(12)},
                                 "no_answer_variants": dict(s.no_answer_variants.most_common(8)),
                                 "variants": {v: dict(sorted(cnt.items())) for v, cnt in sorted(s.variant_codes.items())},
                                 "accepted": sorted(v for v, cnt in s.variant_codes.items()
                                                    if any(200 <= k < 300 for k in cnt)
                                                    and s.variant_expect.get(v) is None),
                                 "examples": s.examples} for c, s in stats.items()}
        total = sum(s.sent for c, s in stats.items() if c not in CONN_CLASSES and c != "auth-nonroot")
        result["auth_nonroot_requests"] = stats["auth-nonroot"].sent if "auth-nonroot" in stats else 0
        result["total_requests"] = total
        result["conn_abuse_requests"] = sum(s.sent for c, s in stats.items() if c in CONN_CLASSES)
        result["requests_per_second"] = total / result["flood_seconds"] if result.get("flood_seconds") else None
        result["conn_abuse"] = {k: {kk: (vv if kk != "lifetimes" else
                                         {"n": len(vv), "p50": pct(vv, 50), "max": max(vv) if vv else None})
                                    for kk, vv in v.items()} for k, v in conn_abuse.items()}
        result["hold_lifetimes"] = {"n": len(engine.hold_lifetimes), "p50": pct(engine.hold_lifetimes, 50),
                                    "max": max(engine.hold_lifetimes) if engine.hold_lifetimes else None}
        phases = {p[0]: (p[1], p[2] or time.monotonic()) for p in run.phases}
        result["probes"] = {ph: {"n": sum(1 for p in probes if p[0] == ph),
                                 "ok": sum(1 for p in probes if p[0] == ph and p[2]),
                                 "p50_ms": pct([p[4] for p in probes if p[0] == ph and p[2]], 50)}
                            for ph in ["flood"] + CONN_CLASSES + ["auth-nonroot", "after"] if ph in phases}
        base = latency_summary(base_rows, 0, float("inf"))
        result["valid"] = {"baseline": base}
        for ph in ["flood"] + CONN_CLASSES + ["auth-nonroot", "after"]:
            if ph in phases:
                result["valid"][ph] = latency_summary(attack_rows, *phases[ph])
        result["jobs"] = {"stored": len(stored), "created_201": len(created_ids),
                          "unexplained": len(stored - created_ids), "missing": len(created_ids - stored),
                          "uncertain": engine.uncertain, "listing_ms": round(list_ms, 1),
                          "listing_bytes": list_bytes,
                          "unexplained_examples": sorted(stored - created_ids)[:5]}
        result["log"] = log_check(run.daemon.logs)

        flood_valid = result["valid"]["flood"]
        checks = [
            ("jouled never died (crashes, restarts needed)", len(monitor.crashes) == 0 and alive_at_end,
             f"{len(monitor.crashes)} crashes"),
            ("every 4xx/5xx is problem+json with a JSON status",
             sum(s.ctype + s.body + s.mismatch for s in stats.values()) == 0,
             f"{sum(s.ctype for s in stats.values())} content-type, {sum(s.body for s in stats.values())} body, "
             f"{sum(s.mismatch for s in stats.values())} status mismatch"),
            # 501 is the answer to a transfer coding other than chunked (RFC 9112 §6.1), not a fault.
            ("no 5xx answers", sum(n for s in stats.values() for code, n in s.codes.items()
                                   if code >= 500 and code not in (501, 503)) == 0,
             f"{sum(n for s in stats.values() for code, n in s.codes.items() if code >= 500 and code not in (501, 503))}"
             f" 5xx (503 busy answers at accept and 501 for an unknown transfer coding not counted)"),
            ("jobs stored = jobs answered 201", result["jobs"]["missing"] == 0 and
             result["jobs"]["unexplained"] <= engine.uncertain,
             f"stored {len(stored)}, 201s {len(created_ids)}, unexplained {result['jobs']['unexplained']} "
             f"(<= {engine.uncertain} unanswered submissions allowed), missing {result['jobs']['missing']}"),
            ("every log line starts with the log prefix", result["log"]["unprefixed"] == 0,
             f"{result['log']['unprefixed']} of {result['log']['lines']} lines without it"),
            ("no control characters (C0, DEL, C1, U+2028/9) or bad UTF-8 in log lines",
             result["log"]["control_or_bad_utf8"] == 0, f"{result['log']['control_or_bad_utf8']} lines"),
            ("HEAD answered without a body", sum(s.head_body for s in stats.values()) == 0,
             f"{sum(s.head_body for s in stats.values())} HEAD answers carried a body"),
            ("no request served without a valid token", sum(s.bypass for s in stats.values()) == 0
             and (not auth or bool(result.get("auth_nonroot", {}).get("uid"))),
             f"{sum(s.bypass for s in stats.values())} served" + (
                 f"; as uid {result.get('auth_nonroot', {}).get('uid')}: "
                 f"{stats['auth-nonroot'].sent if 'auth-nonroot' in stats else 0} requests, "
                 f"{stats['auth-nonroot'].bypass if 'auth-nonroot' in stats else 0} served"
                 + (f" ({result['auth_nonroot']['note']})" if result.get("auth_nonroot", {}).get("note") else "")
                 if auth else " (no auth in this run)")),
            ("well-framed pipelined requests all answered", sum(s.no_answer_pipe for s in stats.values()) == 0,
             f"{sum(s.no_answer_pipe for s in stats.values())} unanswered"),
            ("valid client served throughout the flood",
             flood_valid["healthz"]["failed"] + flood_valid["submit"]["failed"] == 0,
             f"{flood_valid['healthz']['failed'] + flood_valid['submit']['failed']} of "
             f"{flood_valid['healthz']['n'] + flood_valid['submit']['n']} failed"),
        ]
        result["checks"] = [{"check": c, "ok": ok, "detail": d} for c, ok, d in checks]
        report(run, result)
        return result
    finally:
        run.cleanup()


def amplification_run(n):
    """What an accepted job costs jouled's memory, by kind: n jobs of each kind (all within the
    limits, all answered 201, all run `true`), VmRSS before and after, and what listing them costs."""
    run = Run("amplify", 0, False)
    out = {"name": "amplify", "jobs_per_kind": n, "kinds": []}
    try:
        run.daemon = Daemon(run, run.config())
        run.daemon.start()
        print(f"[amplify] jouled pid {run.daemon.proc.pid} on 127.0.0.1:{run.daemon.port}  (load {loadavg()})",
              flush=True)
        env = {"HOSTILE_RUN": run.marker}
        kinds = [
            ("valid job", {"name": "ok", "run": {"command": ["true"], "env": env}}),
            ("name of 256 bytes", {"name": "n" * 256, "run": {"command": ["true"], "env": env}}),
            ("run.env value of 64 KB", {"run": {"command": ["true"], "env": dict(env, A="v" * 65536)}}),
            ("run.env 1,000 x 200 B", {"run": {"command": ["true"], "env": dict(
                env, **{f"V{i}": "v" * 200 for i in range(1000)})}}),
            ("argv 4,000 x 50 B", {"run": {"command": ["true"] + ["a" * 50] * 4000, "env": env}}),
            ("constraints.devices 10,000 x cpu", {"run": {"command": ["true"], "env": env},
                                                  "constraints": {"devices": ["cpu"] * 10000}}),
            ("model of 5,000 relu layers", {"run": {"command": ["true"], "env": env}, "training": TRAINING,
                                            "model": {"input": {"shape": [16]}, "layers": [{"type": "relu"}] * 5000}}),
        ]

        def idle(seconds=120):
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                busy = sum(api(run, "GET", f"/v1/jobs?state={s}&limit=1")[1].get("total", 0)
                           for s in ("queued", "placed", "running", "throttled"))
                if busy == 0:
                    return True
                time.sleep(0.5)
            return False

        for name, body in kinds:
            data = json.dumps(body).encode()
            idle()
            time.sleep(1)
            rss0 = run.daemon.rss_kb()
            post_ms, ids = [], []
            for _ in range(n):
                t0 = time.monotonic()
                status, doc, _ = api(run, "POST", "/v1/jobs", data)
                post_ms.append((time.monotonic() - t0) * 1000)
                if status == 201:
                    ids.append(doc["id"])
            idle()
            time.sleep(1)
            rss1 = run.daemon.rss_kb()
            t0 = time.monotonic()
            _, one, _ = api(run, "GET", f"/v1/jobs/{ids[0]}") if ids else (None, {}, None)
            get_ms = (time.monotonic() - t0) * 1000
            row = {"kind": name, "body_bytes": len(data), "accepted": len(ids),
                   "rss_per_job_kb": (rss1 - rss0) / max(1, len(ids)), "rss_after_mb": rss1 / 1024,
                   "post_p50_ms": pct(post_ms, 50), "job_json_bytes": len(json.dumps(one)), "get_job_ms": get_ms}
            out["kinds"].append(row)
            print(f"[amplify] {name}: {row['accepted']}/{n} accepted, body {len(data):,} B, "
                  f"RSS +{row['rss_per_job_kb']:.1f} kB per job (now {row['rss_after_mb']:.1f} MB), "
                  f"POST p50 {row['post_p50_ms']:.1f} ms, GET /v1/jobs/ID {row['job_json_bytes']:,} B "
                  f"in {get_ms:.1f} ms", flush=True)
        t0 = time.monotonic()
        status, listing, _ = api(run, "GET", "/v1/jobs?limit=1000", timeout=120)
        out["listing"] = {"jobs": listing.get("total") if isinstance(listing, dict) else None,
                          "ms": (time.monotonic() - t0) * 1000, "bytes": len(json.dumps(listing))}
        out["rss_final_mb"] = run.daemon.rss_kb() / 1024
        print(f"[amplify] GET /v1/jobs?limit=1000 (first page) over {out['listing']['jobs']} jobs: "
              f"{out['listing']['bytes'] / 1e6:.1f} MB in {out['listing']['ms']:.0f} ms; RSS "
              f"{out['rss_final_mb']:.1f} MB", flush=True)
        out["load"] = loadavg()
        return out
    finally:
        run.cleanup()


# ------------------------------------------------------------------ report


def f1(x):
    return "-" if x is None or x != x else f"{x:.1f}"


def report(run, r):
    print()
    print(f"=== run '{r['name']}'{' with [auth] tokens' if r['auth'] else ''}: {r['total_requests']:,} requests "
          f"in {r['flood_seconds']:.1f} s ({r['requests_per_second']:.0f}/s), + {r['conn_abuse_requests']:,} "
          f"abusive connections; load {r['load_start']} -> {r['load_end']}")
    print(f"{'class':<14} {'sent':>7} {'answered':>8} {'2xx':>6} {'4xx':>6} {'5xx':>4} {'no ans':>6} {'t/o':>4} "
          f"{'p+json viol':>11} {'unexp':>5} {'extra':>5}  codes")
    for c in CLASSES + ["auth-nonroot"] + CONN_CLASSES:
        s = r["classes"].get(c)
        if not s:
            continue
        codes = s["codes"]
        k2 = sum(n for k, n in codes.items() if 200 <= k < 300)
        k4 = sum(n for k, n in codes.items() if 400 <= k < 500)
        k5 = sum(n for k, n in codes.items() if k >= 500)
        viol = s["ctype_violations"] + s["body_violations"] + s["status_mismatch"]
        unexp = sum(s["unexpected"].values())
        print(f"{c:<14} {s['sent']:>7} {s['answered']:>8} {k2:>6} {k4:>6} {k5:>4} {s['no_answer']:>6} "
              f"{s['timeouts']:>4} {viol:>11} {unexp:>5} {s['extra_answers']:>5}  "
              + " ".join(f"{k}:{n}" for k, n in codes.items()))
    rss = r["rss_kb"]
    print(f"RSS (VmRSS, MB): before {f1((rss['before'] or 0) / 1024)}, max {f1((rss['max'] or 0) / 1024)}, "
          f"final {f1((rss['final'] or 0) / 1024)} ({rss['samples']} samples every 0.5 s); at the end of "
          + ", ".join(f"{ph} {f1((kb or 0) / 1024)}" for ph, kb in rss["at_phase_end"] if ph != "setup"))
    v = r["valid"]
    print("valid client (fresh connection per request), ms p50 / p99, failed:")
    for ph, d in v.items():
        parts = []
        for kind in ("healthz", "submit"):
            x = d[kind]
            b = v["baseline"][kind]
            ratio = x["p50"] / b["p50"] if b["p50"] == b["p50"] and b["p50"] else float("nan")
            ratio99 = x["p99"] / b["p99"] if b["p99"] == b["p99"] and b["p99"] else float("nan")
            parts.append(f"{kind} {f1(x['p50'])} / {f1(x['p99'])} (x{ratio:.2f} / x{ratio99:.2f}), "
                         f"{x['failed']}/{x['n']} failed" + (f" {dict(x['fail_kinds'])}" if x["failed"] else ""))
        print(f"  {ph:<10} " + "; ".join(parts))
    if r["probes"]:
        print("prober (GET /healthz from 127.0.0.1 every 0.25 s): " + ", ".join(
            f"{ph} {p['ok']}/{p['n']} ok (p50 {f1(p['p50_ms'])} ms)" for ph, p in r["probes"].items()))
    for k, st in r["conn_abuse"].items():
        print(f"  {k}: " + ", ".join(f"{kk}={vv}" for kk, vv in st.items()))
    if r["hold_lifetimes"]["n"]:
        h = r["hold_lifetimes"]
        print(f"truncated requests left open: closed by jouled after p50 {f1(h['p50'])} s, max {f1(h['max'])} s "
              f"(n={h['n']})")
    print(f"jobs: {r['jobs']}")
    print(f"log: {r['log']['lines']} lines, {r['log']['bytes']} bytes; unprefixed {r['log']['unprefixed']}, "
          f"with control/non-UTF-8 bytes {r['log']['control_or_bad_utf8']}")
    for e in r["log"]["unprefixed_examples"] + r["log"]["control_examples"]:
        print("   " + e)
    for c in r["crashes"]:
        print(f"CRASH: exit {c['exit']}, last class {c['last_class']} / {c['last_variant']}")
        for line in c["log_tail"][-5:]:
            print("   log: " + line[:200])
    for rep in r["repros"]:
        print(f"REPRODUCER: {rep}" if rep else "REPRODUCER: not isolated (no single request killed it again)")
    interesting = [(c, s) for c, s in r["classes"].items()
                   if s["examples"] or s["unexpected"] or s["no_answer_variants"] or s["head_with_body"]]
    if interesting:
        print("details:")
    for c, s in interesting:
        if s["unexpected"]:
            print(f"  {c}: unexpected statuses: {s['unexpected']}")
        if s["no_answer_variants"] and s["no_answer"]:
            print(f"  {c}: closed without an answer: {s['no_answer_variants']}")
        if s["head_with_body"]:
            print(f"  {c}: HEAD answered with a body: {s['head_with_body']}")
    for c, s in r["classes"].items():
        if s.get("accepted") and c in ("overflow", "json-utf8", "hostile-job", "bad-cl", "chunked", "smuggling",
                                       "target-bytes", "huge-headers", "oversize-body"):
            print(f"  {c}: answered 2xx (no fixed expectation): " + "; ".join(
                f"{v} {s['variants'][v]}" for v in s["accepted"])[:1500])
        for e in s["examples"][:3]:
            print(f"  {c}: {e['what']}: {e['variant']}\n      request {e['request'][:200]}\n      answer  "
                  f"{(e['answer'] or '-')[:200]}")
    print("checks:")
    for c in r["checks"]:
        print(f"  [{'ok' if c['ok'] else 'FAIL'}] {c['check']}: {c['detail']}")
    print(flush=True)


# ------------------------------------------------------------------ main


def main():
    global ARGS, WATCHDOG_END
    ARGS = parse_args()
    if ARGS.valid_client:
        return valid_client_main(*ARGS.valid_client, ARGS.marker)
    if ARGS.auth_probe:
        return auth_probe_main(*ARGS.auth_probe)
    if not os.path.exists(ARGS.jouled):
        print(f"no jouled at {ARGS.jouled} (build it, or --jouled PATH)", file=sys.stderr)
        return 2
    WATCHDOG_END = time.monotonic() + ARGS.limit
    threading.Timer(ARGS.limit + 60, watchdog).start()  # last resort: the loops stop at --limit themselves
    rng = random.Random(ARGS.seed)
    print(f"hostile_client: {ARGS.requests:,} requests (+ {ARGS.auth_requests:,} with auth), jouled {ARGS.jouled}, "
          f"load {loadavg()}, {os.cpu_count()} CPUs", flush=True)
    results = []
    try:
        results.append(run_once("plain", ARGS.requests, False, rng))
        if ARGS.auth_requests > 0:
            results.append(run_once("auth", ARGS.auth_requests, True, rng))
        amplification = amplification_run(ARGS.amplification) if ARGS.amplification > 0 else None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        for t in threading.enumerate():
            if isinstance(t, threading.Timer):
                t.cancel()
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump({"runs": results, "amplification": amplification}, f, indent=1, default=str)
    failed = [(r["name"], c["check"]) for r in results for c in r["checks"] if not c["ok"]]
    print("summary: " + ("all checks passed" if not failed else "FAILED: " + "; ".join(f"{n}: {c}" for n, c in failed)))
    return 1 if failed else 0


def watchdog():
    print(f"watchdog: --limit {ARGS.limit} s passed; stopping everything", file=sys.stderr, flush=True)
    for run in list(RUNS):
        try:
            run.cleanup()
        except Exception as e:  # keep stopping the others
            print(f"watchdog: {e}", file=sys.stderr)
    os._exit(3)


ARGS = None
WATCHDOG_END = 0.0
RUNS = []

if __name__ == "__main__":
    sys.exit(main())
