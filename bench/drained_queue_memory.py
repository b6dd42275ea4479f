#!/usr/bin/python3
"""drained_queue_memory.py: jouled's resident memory while jobs submitted together run to the end,
and after the queue has drained (issue 32).

    python3 bench/drained_queue_memory.py --jobs 10000 --wave 10000   # all queued at once: ~4 min
    python3 bench/drained_queue_memory.py --jobs 6000 --wave 100      # a short queue throughout
    python3 bench/drained_queue_memory.py --jobs 100000 --wave 100 --restart   # ~25 min
    python3 bench/drained_queue_memory.py --jobs 2500 --wave 100 --settle 0 --after 500 --max-growth 2
                                      # the test (ctest memory_finished_jobs): fails on growth

One jouled (`cpu`, probing off, a simulated device that estimates, as bench/finished_jobs.py),
at log level debug. `--jobs` `true` jobs with a model and training, submitted `--wave` at a time,
each wave waited for. Prints VmRSS at the start, after each wave (sampled), after the last and
`--settle` seconds later, and jouled's "released the heap's free memory" lines (how much lay free,
what was in use, how long the release held the event loop). With `--restart`, jouled is then
stopped and started again on the same state, and its VmRSS once ready and `--settle` s later is
set beside the first start's. With `--max-growth MIB`, it exits 1 when VmRSS after the last wave
exceeds VmRSS after the first `--after` jobs by more than MIB: what each finished job leaves in
memory, 1.6 KB before issue 32, would show as 3 MiB over 2,000 jobs; the first few hundred jobs
fill SQLite's page caches and the allocator's arenas and are left out. Needs no meter: nothing
here is joules.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from finished_jobs import memory_kib, run_jobs  # noqa: E402  bench/finished_jobs.py
from loopback import free_port  # noqa: E402
from soak import Node  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--jobs", type=int, default=10000)
    p.add_argument("--wave", type=int, default=10000, help="jobs submitted before waiting for them all")
    p.add_argument("--settle", type=float, default=25.0, help="seconds to wait after the last job")
    p.add_argument("--restart", action="store_true", help="then start jouled again on the same state")
    p.add_argument("--keep", action="store_true", help="keep the state directory (printed) for a look afterwards")
    p.add_argument("--after", type=int, default=500, help="jobs before the growth --max-growth bounds starts")
    p.add_argument("--max-growth", type=float, help="fail when RSS grows more than this many MiB after --after jobs")
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="joule-drained-")
    os.chmod(root, 0o755)  # jobs run as accounts of their own when jouled runs as root
    config = ("[log]\nlevel = \"debug\"\n[[devices]]\nname = \"cpu\"\nthreads = 1\n"
              "[[devices]]\nname = \"sim:laptop-cpu\"\n[probing]\nenabled = false\n"
              f"[server]\nmax_queued_jobs = {max(10000, args.wave)}\n")
    node = Node(args.build, root, free_port(), config=config)
    try:
        node.start()
        start = memory_kib(node.proc.pid)["VmRSS"]
        print(f"load {os.getloadavg()[0]:.2f}; RSS at start {start / 1024:.1f} MiB", flush=True)
        began = time.monotonic()
        _, rss = run_jobs(node, args.jobs, "q", wave=args.wave)
        shown = rss[:: max(1, len(rss) // 12)]
        print(f"{args.jobs} jobs in waves of {args.wave}: {time.monotonic() - began:.0f} s; RSS after waves "
              f"{', '.join(f'{k / 1024:.1f}' for k in shown)} MiB; after the last {rss[-1] / 1024:.1f} MiB", flush=True)
        if args.max_growth is not None:
            first = rss[min(len(rss) - 1, max(0, args.after // args.wave - 1))]
            growth = (rss[-1] - first) / 1024
            print(f"growth from job {args.after} to job {args.jobs}: {growth:+.2f} MiB "
                  f"(bound {args.max_growth} MiB: {(growth * 1024 * 1024) / max(1, args.jobs - args.after):.0f} "
                  f"bytes a job)", flush=True)
            if growth > args.max_growth:
                print(f"FAIL: jouled kept {growth:.2f} MiB more after {args.jobs - args.after} finished jobs", flush=True)
                sys.exit(1)
        time.sleep(args.settle)
        end = memory_kib(node.proc.pid)
        print(f"{args.settle:.0f} s later: RSS {end['VmRSS'] / 1024:.1f} MiB (peak {end['VmHWM'] / 1024:.1f}), "
              f"{(end['VmRSS'] - start) / 1024:+.1f} MiB from the start; load {os.getloadavg()[0]:.2f}")
        releases = subprocess.run(["grep", "released the heap", node.log_path], capture_output=True, text=True).stdout
        print(f"{len(releases.splitlines())} releases:")
        print(releases.rstrip())
        if args.restart:
            node.stop()
            node.start()
            ready = memory_kib(node.proc.pid)["VmRSS"]
            time.sleep(args.settle)
            later = memory_kib(node.proc.pid)["VmRSS"]
            print(f"started again on the same state: RSS {ready / 1024:.1f} MiB once ready, {later / 1024:.1f} MiB "
                  f"{args.settle:.0f} s later ({(later - start) / 1024:+.1f} MiB from the first start)", flush=True)
            with open(f"/proc/{node.proc.pid}/status") as status:
                print("  " + " ".join(line.split(":")[0] + line.split(":")[1].strip().replace(" kB", "k")
                                      for line in status if line.startswith(("RssAnon", "RssFile", "RssShmem"))))
    finally:
        node.stop()
        if args.keep:
            print(f"kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
