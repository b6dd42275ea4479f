"""loopback.py: what bench/soak.py and bench/chaos.py share: talking to a jouled on 127.0.0.1, a
seed, and a directory for the jobs' own marks."""

import json
import os
import random
import socket
import tempfile
import urllib.error
import urllib.request


def seeded(seed):
    """Seeds `random` with `seed`, or with a random seed when it is None; returns the seed (to print)."""
    seed = seed if seed is not None else random.randrange(1 << 30)
    random.seed(seed)
    return seed


def marked_root(prefix):
    """A temporary directory others may enter, with a `marks` directory in it where every job's
    account may write its marks: (root, marks)."""
    root = tempfile.mkdtemp(prefix=prefix)
    os.chmod(root, 0o755)
    marks = os.path.join(root, "marks")
    os.mkdir(marks)
    os.chmod(marks, 0o1777)
    return root, marks


def free_port():
    """A loopback port nothing listens on now, for a jouled that must keep its port across
    restarts: taken below the kernel's ephemeral range, because between a kill and the restart
    any outgoing connection on the machine (other tests' clients) may be given a free ephemeral
    port as its own, and jouled's restart then fails to bind (CI saw this once)."""
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    chooser = random.Random()  # not the seeded `random`: two scripts with one seed must not collide
    for _ in range(200):
        port = chooser.randrange(max(1024, low // 2), low) if low > 2048 else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError("no free loopback port below the ephemeral range")


def call(port, method, path, body=None, timeout=5):
    """(HTTP status, parsed JSON body, or the text when it is not JSON). Raises OSError when
    nothing answers."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, json.loads(reply.read().decode() or "null")
    except urllib.error.HTTPError as e:
        text = e.read().decode("utf-8", "replace")
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, text
