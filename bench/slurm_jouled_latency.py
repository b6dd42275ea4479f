#!/usr/bin/env python3
"""Helper of bench/slurm_jouled_latency.sh (Python 3 stdlib only).

  measure: alternates ROUNDS jobs submitted through jouled (POST /v1/jobs onto slurm:cpu/*)
           and ROUNDS plain `sbatch --parsable -p joule --wrap ...`, one job at a time, and
           writes the raw timings of every round as JSON.
  report:  reads one or more `measure` outputs with jouled's and slurmctld's logs, prints the
           tables (p50/p90/max) and where jouled's extra time goes, and writes the results JSON.

Every job's command is `date +%s.%N > START_FILE` (then `sleep HOLD` with --hold): the wall
clock when the command ran.
"""
import argparse
import datetime
import http.client
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time

TERMINAL = {"succeeded", "failed", "cancelled"}
SLURM_TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                  "BOOT_FAIL", "DEADLINE"}


def log(message):
    print(f"slurm_jouled_latency: {message}", file=sys.stderr, flush=True)


def read_start(path):
    """The epoch seconds the command wrote, or None while the file is absent or half written."""
    try:
        with open(path) as f:
            text = f.read().strip()
        return float(text) if text else None
    except (OSError, ValueError):
        return None


class Jouled:
    def __init__(self, port):
        self.port = port
        self.conn = None

    def get(self, path):
        """GET on a kept-alive connection (reopened once if jouled closed it)."""
        for attempt in (0, 1):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                self.conn.request("GET", path)
                response = self.conn.getresponse()
                return response.status, json.loads(response.read() or b"null")
            except (OSError, http.client.HTTPException):
                if self.conn:
                    self.conn.close()
                self.conn = None
                if attempt:
                    raise

    def submit(self, body):
        """POST /v1/jobs on a new connection, as a client submitting once would."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("POST", "/v1/jobs", body=json.dumps(body), headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, json.loads(response.read() or b"null")
        finally:
            conn.close()


def script(start_file, hold):
    return f"date +%s.%N > {start_file}" + (f"; sleep {hold:g}" if hold > 0 else "")


def jouled_round(jouled, workdir, name, start_file, hold, poll_s, timeout_s):
    body = {"name": name,
            "run": {"command": ["/bin/sh", "-c", script(start_file, hold)], "workdir": workdir},
            "constraints": {"devices": ["slurm:cpu/*"]}}
    t0 = time.time()
    status, answer = jouled.submit(body)
    t1 = time.time()
    record = {"path": "jouled", "name": name, "t0": t0, "submit_s": t1 - t0, "http_status": status}
    if status != 201:
        record["error"] = f"POST /v1/jobs answered {status}: {answer}"
        return record
    job_id = answer["id"]
    record["job_id"] = job_id
    deadline = t0 + timeout_s
    state = None
    while time.time() < deadline:
        code, job = jouled.get(f"/v1/jobs/{job_id}")
        seen = time.time()
        state = job.get("state") if code == 200 else None
        if state in ("running", "succeeded") and "running_at" not in record:
            record["running_at"] = seen
            record["device"] = job.get("device")
        if state in TERMINAL:
            record["state"] = state
            record["reason"] = job.get("reason", "")
            match = re.search(r"Slurm job (\d+)", record["reason"])
            if match:
                record["slurm_id"] = match.group(1)
            break
        time.sleep(poll_s)
    else:
        record["error"] = f"not finished after {timeout_s} s (last state {state})"
        return record
    started = read_start(start_file)
    if started is None:
        record["error"] = f"job {state} but {start_file} holds no time ({record.get('reason')})"
    else:
        record["started_at"] = started
    return record


def plain_round(workdir, start_file, hold, poll_s, timeout_s):
    t0 = time.time()
    done = subprocess.run(["sbatch", "--parsable", "-p", "joule", "--wrap", script(start_file, hold)],
                          cwd=workdir, capture_output=True, text=True)
    t1 = time.time()
    record = {"path": "plain", "t0": t0, "submit_s": t1 - t0}
    if done.returncode != 0:
        record["error"] = f"sbatch exited {done.returncode}: {done.stderr.strip()}"
        return record
    slurm_id = done.stdout.strip().split(";")[0]
    record["slurm_id"] = slurm_id
    deadline = t0 + timeout_s
    while time.time() < deadline:
        started = read_start(start_file)
        if started is not None:
            record["started_at"] = started
            break
        time.sleep(poll_s)
    else:
        record["error"] = f"command did not run within {timeout_s} s"
        return record
    # Until Slurm has let go of it, so that the next round finds both CPUs free.
    while time.time() < deadline:
        state = subprocess.run(["squeue", "-h", "-j", slurm_id, "-o", "%T"], capture_output=True,
                               text=True).stdout.strip()
        if not state or state in SLURM_TERMINAL:
            record["state"] = state or "gone"
            return record
        time.sleep(0.05)
    record["error"] = f"Slurm job {slurm_id} not finished within {timeout_s} s"
    return record


def cpu_times():
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields), idle


def measure(args):
    random.seed(args.seed)
    jouled = Jouled(args.port)
    rounds = []
    busy0 = cpu_times()
    began = time.time()
    for i in range(args.rounds):
        for path in ("jouled", "plain"):
            start_file = os.path.join(args.workdir, f"{args.label}-{path}-{i}.start")
            if path == "jouled":
                record = jouled_round(jouled, args.workdir, f"lat-{args.label}-{i}", start_file, args.hold,
                                      args.poll_ms / 1000,
                                      args.timeout)
            else:
                record = plain_round(args.workdir, start_file, args.hold, args.poll_ms / 1000, args.timeout)
            record["round"] = i
            rounds.append(record)
            if "error" in record:
                log(f"round {i} {path}: {record['error']}")
            else:
                started_ms = 1000 * (record["started_at"] - record["t0"])
                log(f"round {i} {path}: command started {started_ms:.0f} ms after submit")
            # A random pause, so that submissions fall at every phase of slurmctld's scheduling cycle.
            time.sleep(random.uniform(0, args.gap))
    busy1 = cpu_times()
    total, idle = busy1[0] - busy0[0], busy1[1] - busy0[1]
    result = {"label": args.label, "poll_seconds": args.poll_seconds, "hold_seconds": args.hold, "rounds": rounds,
              "seconds": time.time() - began, "machine_busy_percent": 100.0 * (total - idle) / total if total else None,
              "loadavg_after": open("/proc/loadavg").read().split()[:3]}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


# ---------------------------------------------------------------------------------------------- report

JOULED_LINE = re.compile(r"^(\S+) \w+: (?:job (\S+) \(([^)]*)\): (accepted|placed|running|succeeded|failed)\b|"
                         r"slurm: job (\S+)\.\d+ submitted as Slurm job (\d+))")
CTLD_SUBMIT = re.compile(r"^\[(\S+)\] _slurm_rpc_submit_batch_job: JobId=(\d+)")
CTLD_ALLOC = re.compile(r"^\[(\S+)\] (?:sched: Allocate JobId=(\d+)|sched/backfill: _start_job: Started JobId=(\d+))")


def local_ts(text):
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f").timestamp()


def parse_jouled_log(path):
    """job id -> {event: epoch seconds}, and the raw lines of each job."""
    events, lines = {}, {}
    with open(path, errors="replace") as f:
        for line in f:
            match = JOULED_LINE.match(line)
            if not match:
                continue
            at = local_ts(match.group(1))
            if match.group(2):
                job, event = match.group(2), match.group(4)
            else:
                job, event = match.group(5), "sbatch_returned"
                events.setdefault(job, {})["slurm_id"] = match.group(6)
            events.setdefault(job, {}).setdefault(event, at)
            if event in ("running", "succeeded", "failed"):
                # A job shorter than a poll interval goes from placed to succeeded: Slurm said
                # COMPLETED at the first listing that had it started.
                events[job].setdefault("started", at)
            lines.setdefault(job, []).append(line.rstrip())
    return events, lines


def parse_slurmctld_log(path):
    """Slurm job id -> {"received": t, "allocated": t}, and the raw lines."""
    events, lines = {}, {}
    try:
        with open(path, errors="replace") as f:
            for line in f:
                match = CTLD_SUBMIT.match(line)
                if match:
                    events.setdefault(match.group(2), {})["received"] = local_ts(match.group(1))
                    lines.setdefault(match.group(2), []).append(line.rstrip())
                    continue
                match = CTLD_ALLOC.match(line)
                if match:
                    job = match.group(2) or match.group(3)
                    events.setdefault(job, {}).setdefault("allocated", local_ts(match.group(1)))
                    lines.setdefault(job, []).append(line.rstrip())
    except OSError:
        pass
    return events, lines


def all_lines(path):
    with open(path, errors="replace") as f:
        return [line.rstrip() for line in f if re.match(r"^\d{4}-\d\d-\d\dT", line)]


def line_ts(line):
    return local_ts(line.split(" ", 1)[0])


def pct(values, q):
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    # Nearest rank: p50 of 20 values is the 10th, p90 the 18th.
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def summary(values):
    values = [v for v in values if v is not None]
    return {"n": len(values), "p50": pct(values, 50), "p90": pct(values, 90), "max": max(values) if values else None,
            "mean": statistics.fmean(values) if values else None}


def fmt(x):
    return "-" if x is None or x != x else f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}"


def report(args):
    phases = []
    for part in args.parts:
        with open(part) as f:
            phases.append(json.load(f))
    jouled_logs = dict(item.split("=", 1) for item in args.jouled_log)
    ctld_events, ctld_lines = parse_slurmctld_log(args.slurmctld_log)
    results = {"when": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
               "command": args.command, "machine": {"cpus": os.cpu_count(), "slurm": args.slurm_version,
                                                    "jouled": args.jouled_version},
               "phases": []}
    ms = lambda a, b: None if a is None or b is None else 1000.0 * (b - a)
    for phase in phases:
        label = phase["label"]
        j_events, j_lines = parse_jouled_log(jouled_logs[label])
        ok = [r for r in phase["rounds"] if "error" not in r]
        errors = [r for r in phase["rounds"] if "error" in r]
        jouled = [r for r in ok if r["path"] == "jouled"]
        plain = [r for r in ok if r["path"] == "plain"]
        table = {
            "jouled": {"submit call": summary([1000 * r["submit_s"] for r in jouled]),
                       "submit -> command started": summary([ms(r["t0"], r["started_at"]) for r in jouled]),
                       "submit -> jouled says running": summary([ms(r["t0"], r.get("running_at")) for r in jouled])},
            "plain": {"submit call": summary([1000 * r["submit_s"] for r in plain]),
                      "submit -> command started": summary([ms(r["t0"], r["started_at"]) for r in plain])},
        }
        ratio = {q: table["jouled"]["submit -> command started"][q] / table["plain"]["submit -> command started"][q]
                 for q in ("p50", "p90", "max", "mean") if table["plain"]["submit -> command started"]["n"]}
        # Where the time goes, per job, from jouled's and slurmctld's logs (ms timestamps).
        steps_j, steps_p = [], []
        for r in jouled:
            e = j_events.get(r["job_id"], {})
            s = ctld_events.get(e.get("slurm_id") or r.get("slurm_id"), {})
            steps_j.append({
                "job_id": r["job_id"], "slurm_id": e.get("slurm_id"),
                "submit -> accepted (log)": ms(r["t0"], e.get("accepted")),
                "accepted -> placed": ms(e.get("accepted"), e.get("placed")),
                "placed -> slurmctld has it": ms(e.get("placed"), s.get("received")),
                "placed -> sbatch returned (log)": ms(e.get("placed"), e.get("sbatch_returned")),
                "slurmctld has it -> allocated": ms(s.get("received"), s.get("allocated")),
                "allocated -> command started": ms(s.get("allocated"), r["started_at"]),
                "allocated -> jouled says running (log)": ms(s.get("allocated"), e.get("started")),
                "command started -> jouled says running (log)": ms(r["started_at"], e.get("started")),
                "submit -> slurmctld has it": ms(r["t0"], s.get("received")),
            })
        for r in plain:
            s = ctld_events.get(r.get("slurm_id"), {})
            steps_p.append({"slurm_id": r.get("slurm_id"),
                            "submit -> slurmctld has it": ms(r["t0"], s.get("received")),
                            "slurmctld has it -> allocated": ms(s.get("received"), s.get("allocated")),
                            "allocated -> command started": ms(s.get("allocated"), r["started_at"])})
        keys_j = [k for k in steps_j[0] if k not in ("job_id", "slurm_id")] if steps_j else []
        keys_p = [k for k in steps_p[0] if k != "slurm_id"] if steps_p else []
        breakdown = {"jouled": {k: summary([x[k] for x in steps_j]) for k in keys_j},
                     "plain": {k: summary([x[k] for x in steps_p]) for k in keys_p}}
        examples = []
        for x in steps_j[:args.examples]:
            examples.append({"job_id": x["job_id"], "jouled_log": j_lines.get(x["job_id"], []),
                             "slurmctld_log": ctld_lines.get(x["slurm_id"], [])})

        print(f"\n== jouled [slurm] poll_seconds = {phase['poll_seconds']}, command holds "
              f"{phase.get('hold_seconds', 0):g} s: {len(jouled)} jobs through jouled, {len(plain)} plain sbatch, "
              f"alternating, same Slurm ({phase['seconds']:.0f} s, machine "
              f"{phase['machine_busy_percent']:.0f} % busy, load {' '.join(phase['loadavg_after'])})")
        print(f"{'ms':30} {'jouled p50':>10} {'p90':>6} {'max':>6} {'mean':>6} | "
              f"{'sbatch p50':>10} {'p90':>6} {'max':>6} {'mean':>6}")
        for row in ("submit call", "submit -> command started", "submit -> jouled says running"):
            j, p = table["jouled"].get(row), table["plain"].get(row)
            cells = [fmt(j[q]) if j else "-" for q in ("p50", "p90", "max", "mean")]
            cells += [fmt(p[q]) if p else "-" for q in ("p50", "p90", "max", "mean")]
            print(f"{row:30} {cells[0]:>10} {cells[1]:>6} {cells[2]:>6} {cells[3]:>6} | "
                  f"{cells[4]:>10} {cells[5]:>6} {cells[6]:>6} {cells[7]:>6}")
        if ratio:
            print(f"ratio jouled/sbatch, submit -> command started: p50 {ratio['p50']:.2f}, p90 {ratio['p90']:.2f}, "
                  f"max {ratio['max']:.2f}, mean {ratio['mean']:.2f}")
        print("where the time goes (p50 / p90 / max ms; logs have 1 ms resolution):")
        for path, rows in breakdown.items():
            for key, s in rows.items():
                print(f"  {path:6} {key:36} {fmt(s['p50']):>6} / {fmt(s['p90']):>6} / {fmt(s['max']):>6}  (n={s['n']})")
        for example in examples:
            print(f"  job {example['job_id']}:")
            for line in example["jouled_log"] + example["slurmctld_log"]:
                print(f"    {line}")
        slow = []
        for r in jouled:
            if r["submit_s"] > args.slow_submit_ms / 1000:
                # What jouled logged while the POST waited (its log, 1 ms resolution).
                during = [line for line in all_lines(jouled_logs[label])
                          if r["t0"] - 0.001 <= line_ts(line) <= r["t0"] + r["submit_s"] + 0.001]
                slow.append({"round": r["round"], "submit_ms": 1000 * r["submit_s"], "jouled_log": during})
                print(f"  slow POST in round {r['round']}: {1000 * r['submit_s']:.0f} ms; jouled logged meanwhile:")
                for line in during:
                    print(f"    {line}")
        for r in errors:
            print(f"  ERROR round {r['round']} {r['path']}: {r['error']}")
        results["phases"].append({"poll_seconds": phase["poll_seconds"], "hold_seconds": phase.get("hold_seconds", 0),
                                  "table_ms": table,
                                  "ratio_jouled_over_plain_command_started": ratio, "breakdown_ms": breakdown,
                                  "per_job_ms": {"jouled": steps_j, "plain": steps_p}, "examples": examples,
                                  "slow_submits": slow,
                                  "errors": len(errors), "seconds": phase["seconds"],
                                  "machine_busy_percent": phase["machine_busy_percent"],
                                  "loadavg_after": phase["loadavg_after"], "rounds": phase["rounds"]})
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nresults: {args.json}")
    return 1 if any(p["errors"] for p in results["phases"]) else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command_name", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--port", type=int, required=True)
    m.add_argument("--workdir", required=True)
    m.add_argument("--rounds", type=int, default=20)
    m.add_argument("--label", required=True)
    m.add_argument("--poll-seconds", type=float, required=True, help="jouled's [slurm] poll_seconds (recorded)")
    m.add_argument("--poll-ms", type=float, default=20, help="how often this client polls (jouled, the start file)")
    m.add_argument("--gap", type=float, default=2.0, help="random pause 0..GAP s after each job")
    m.add_argument("--hold", type=float, default=0, help="the command sleeps this long after writing the time")
    m.add_argument("--timeout", type=float, default=60)
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--out", required=True)
    r = sub.add_parser("report")
    r.add_argument("--json", required=True)
    r.add_argument("--jouled-log", action="append", default=[], help="LABEL=PATH")
    r.add_argument("--slurmctld-log", required=True)
    r.add_argument("--command", default="")
    r.add_argument("--slurm-version", default="")
    r.add_argument("--jouled-version", default="")
    r.add_argument("--examples", type=int, default=2)
    r.add_argument("--slow-submit-ms", type=float, default=100, help="show jouled's log during slower POSTs")
    r.add_argument("parts", nargs="+")
    args = parser.parse_args()
    return measure(args) if args.command_name == "measure" else report(args)


if __name__ == "__main__":
    sys.exit(main() or 0)
