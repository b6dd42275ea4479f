"""loopback.py: what bench/soak.py and bench/chaos.py share to talk to a jouled on 127.0.0.1."""

import json
import socket
import urllib.error
import urllib.request


def free_port():
    """A loopback port nothing listens on now (for a jouled that must keep its port across restarts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
