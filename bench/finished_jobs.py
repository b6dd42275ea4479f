#!/usr/bin/python3
"""finished_jobs.py: jouled's memory and answers as finished jobs pile up (issue 18).

    python3 bench/finished_jobs.py --json /tmp/finished.json          # 0, 100,000, 1,000,000: ~10 min
    python3 bench/finished_jobs.py --counts 0 20000 --jobs 200        # a short run

One jouled (a `cpu` device, probing off, and a simulated device that only estimates, so that each
job's stored estimate has a model's layers in it; its own state directory). First `--jobs` real jobs run
through it (a shell command each, with a model and training so their rows carry estimates as
real ones do). Then, for each count in `--counts`, jouled is stopped, the database is filled with
copies of those finished rows (and their events) up to that many finished jobs, and jouled is
started again and measured:
  - start: seconds to the first 200 from /readyz, and its resident memory then (VmRSS, and the
    peak VmHWM while starting);
  - reads: GET /v1/jobs?state=succeeded pages of 100 (the first 50, walked by cursor), the
    newest page of every job, 200 GET /v1/jobs/{id} of copies picked at random, each timed;
    /healthz meanwhile;
  - usage: GET /v1/usage over every stored job by owner, project, device, node and day (the
    copies are spread over 50 owners and 8 projects), each timed, and /healthz while one runs;
  - running on: `--jobs` more real jobs run in waves of 100 (each submitted, then waited for,
    so the queue stays short); VmRSS after each wave.
Memory that does not grow with the count, and reads that cost a page, are what issue 18 asks.
No joules are measured here: the jobs' energy figures are the node's `modelled` meter.
"""

import argparse
import json
import os
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time

from loopback import free_port  # bench/loopback.py, beside this script
from soak import Node, log, percentile  # bench/soak.py: jouled started, stopped and called

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A small CNN: its estimate is stored with each job, as with any job that names a model.
MODEL = {"input": {"shape": [1, 28, 28]}, "layers": [
    {"type": "conv2d", "out_channels": 4, "kernel_size": 3}, {"type": "relu"},
    {"type": "flatten"}, {"type": "linear", "out_features": 10}], "loss": "cross_entropy"}


def memory_kib(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def timed(node, path):
    started = time.monotonic()
    status, body = node.call("GET", path, timeout=60)
    return time.monotonic() - started, status, body


def run_jobs(node, count, tag, wave=100):
    """Runs `count` jobs in waves of `wave`, each submitted and then waited for, so that the queue
    stays short: what memory holds after a wave is what the finished jobs left. VmRSS after every
    wave, and the ids."""
    ids, rss = [], []
    for first in range(0, count, wave):
        for i in range(first, min(count, first + wave)):
            body = {"name": f"{tag}-{i}", "run": {"command": ["true"]}, "model": MODEL,
                    "training": {"batch_size": 8, "samples_per_epoch": 64, "epochs": 1}}
            status, answer = node.call("POST", "/v1/jobs", body)
            if status != 201:
                raise RuntimeError(f"job {i} not accepted: {status} {answer}")
            ids.append(answer["id"])
        deadline = time.monotonic() + 300
        while not all(node.call("GET", f"/v1/jobs?state={state}&limit=1")[1]["total"] == 0
                      for state in ("queued", "placed", "running")):
            if time.monotonic() > deadline:
                raise RuntimeError("a wave of jobs did not end within 5 minutes")
            time.sleep(0.05)
        rss.append(memory_kib(node.proc.pid)["VmRSS"])
    return ids, rss


def fill(database, template_ids, count, log_every=200_000):
    """Copies the template rows (finished jobs) and their events until `count` jobs are finished."""
    db = sqlite3.connect(database)
    have = db.execute("SELECT COUNT(*) FROM jobs WHERE state IN ('succeeded', 'failed', 'cancelled')").fetchone()[0]
    sequence = db.execute("SELECT MAX(sequence) FROM jobs").fetchone()[0]
    columns = ("name, spec, state, priority, device, submitted_ms, started_ms, finished_ms, exit_code, reason, "
               "energy_joules, energy_source, pid, pid_start_ticks, boot_id, estimate, token_sha256, epoch, origin, "
               "owner_uid, energy_partial, estimated_joules")
    copy = 0
    while have < count:
        batch = min(log_every, count - have)
        db.execute("BEGIN")
        for n in range(batch):
            template = template_ids[(copy + n) % len(template_ids)]
            new_sequence = sequence + 1 + copy + n
            new_id = f"{template}-copy-{new_sequence}"
            # Spread over 50 owners and 8 projects, so that usage reports have groups to sum.
            db.execute(f"INSERT INTO jobs (id, sequence, owner, project, {columns}) SELECT ?, ?, ?, ?, {columns} "
                       "FROM jobs WHERE id = ?",
                       (new_id, new_sequence, f"uid:{1000 + new_sequence % 50}", f"p{new_sequence % 8}", template))
            db.execute("INSERT INTO job_events (job_id, at_ms, state, message) "
                       "SELECT ?, at_ms, state, message FROM job_events WHERE job_id = ? ORDER BY id",
                       (new_id, template))
        db.execute("COMMIT")
        copy += batch
        have += batch
        log(f"  {have:,} finished jobs stored")
    db.close()


def measure(node, copies, pages=50):
    ready = node.start()
    start_memory = memory_kib(node.proc.pid)
    listing, healthz = [], []
    path = "/v1/jobs?state=succeeded&limit=100"
    for _ in range(pages):
        seconds, status, body = timed(node, path)
        assert status == 200, (status, body)
        listing.append(seconds)
        healthz.append(timed(node, "/healthz")[0])
        if body["next"] is None:
            break
        path = f"/v1/jobs?state=succeeded&limit=100&after={body['next']}"
    newest_seconds, _, newest = timed(node, "/v1/jobs?limit=100&order=newest")
    views = []
    for job_id in random.sample(copies, min(200, len(copies))) if copies else []:
        seconds, status, body = timed(node, f"/v1/jobs/{job_id}")
        assert status == 200 and body["state"] in ("succeeded", "failed", "cancelled"), (status, body)
        views.append(seconds)
    # Usage reports over every stored job, each group_by, timed; /healthz timed while one is
    # summed (on jouled's report thread, not its loop).
    usage = {}
    for group_by in ("owner", "project", "device", "node", "day"):
        seconds, status, body = timed(node, f"/v1/usage?from=2000-01-01T00:00:00Z&to=2100-01-01T00:00:00Z"
                                            f"&group_by={group_by}")
        assert status == 200, (status, body)
        usage[group_by] = {"ms": 1000 * seconds, "groups": len(body["rows"]),
                           "jobs": sum(row["jobs"] for row in body["rows"])}
    during = []
    report = threading.Thread(target=timed, args=(node, "/v1/usage?from=2000-01-01T00:00:00Z&to=2100-01-01T00:00:00Z"
                                                        "&group_by=day"))
    report.start()
    while report.is_alive():
        during.append(timed(node, "/healthz")[0])
    report.join()
    return {
        "usage_ms": usage,
        "healthz_ms_while_a_usage_report_is_summed": ({"p50": 1000 * statistics.median(during),
                                                       "max": 1000 * max(during), "calls": len(during)}
                                                      if during else None),
        "ready_seconds": ready,
        "rss_kib_at_start": start_memory["VmRSS"],
        "peak_rss_kib_while_starting": start_memory["VmHWM"],
        "total_jobs_listed": newest["total"],
        "list_page_ms": {"p50": 1000 * statistics.median(listing), "p99": 1000 * percentile(listing, 99),
                         "pages": len(listing)},
        "newest_page_ms": 1000 * newest_seconds,
        "job_view_ms": ({"p50": 1000 * statistics.median(views), "p99": 1000 * percentile(views, 99),
                         "views": len(views)} if views else None),
        "healthz_ms": {"p50": 1000 * statistics.median(healthz), "p99": 1000 * percentile(healthz, 99)},
        "rss_kib_after_reads": memory_kib(node.proc.pid)["VmRSS"],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=os.path.join(REPO, "build"))
    parser.add_argument("--counts", type=int, nargs="+", default=[0, 100_000, 1_000_000],
                        help="finished jobs stored at each restart (default 0 100000 1000000)")
    parser.add_argument("--jobs", type=int, default=1000, help="real jobs run before and after each restart")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the state directory")
    parser.add_argument("--json")
    args = parser.parse_args()
    random.seed(args.seed)
    root = tempfile.mkdtemp(prefix="joule-finished-")
    os.chmod(root, 0o755)  # jobs run as accounts of their own when jouled runs as root
    # The simulated device runs nothing; its model gives each job an estimate with its layers, so
    # that rows are the size of a probed node's.
    config = ("[log]\nlevel = \"warn\"\n[[devices]]\nname = \"cpu\"\nthreads = 1\n"
              "[[devices]]\nname = \"sim:laptop-cpu\"\n[probing]\nenabled = false\n"
              "[server]\nmax_queued_jobs = 100000\n")
    node = Node(args.build, root, free_port(), config=config)
    database = os.path.join(node.state, "jouled.db")
    results = {"load_average_at_start": os.getloadavg(), "jobs_per_round": args.jobs, "rounds": []}
    try:
        node.start()
        log(f"running {args.jobs} jobs to copy from")
        templates, _ = run_jobs(node, args.jobs, "template")
        node.stop()
        copies = []
        for count in args.counts:
            fill(database, templates, count)
            copies = [row[0] for row in sqlite3.connect(database).execute(
                "SELECT id FROM jobs WHERE id LIKE '%-copy-%' ORDER BY random() LIMIT 1000")]
            size = os.path.getsize(database)
            log(f"{count:,} finished jobs ({size / 2**20:.0f} MiB of database): starting jouled")
            round_result = {"finished_jobs_stored": count, "database_mib": size / 2**20}
            round_result.update(measure(node, copies))
            log(f"  ready in {round_result['ready_seconds']:.2f} s, RSS {round_result['rss_kib_at_start'] / 1024:.1f} MiB; "
                f"page p99 {round_result['list_page_ms']['p99']:.1f} ms; usage "
                + ", ".join(f"{k} {v['ms']:.0f} ms" for k, v in round_result["usage_ms"].items()))
            _, rss = run_jobs(node, args.jobs, f"after-{count}")
            round_result["rss_kib_while_running_jobs"] = rss
            round_result["rss_kib_after_jobs"] = memory_kib(node.proc.pid)["VmRSS"]
            shown = rss if len(rss) <= 10 else rss[:: len(rss) // 10]
            log(f"  {args.jobs} more jobs run: RSS {', '.join(f'{k / 1024:.1f}' for k in shown)} MiB")
            results["rounds"].append(round_result)
            node.stop()
    finally:
        node.stop()
        results["load_average_at_end"] = os.getloadavg()
        if args.keep:
            log(f"state kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
