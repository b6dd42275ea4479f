#!/usr/bin/env python3
"""jouled under the unit's RestrictAddressFamilies=, emulated: a loopback client without a token
must still be known by its uid.

    address_families_test.py UNIT JOULED JOULECTL

systemd implements RestrictAddressFamilies= as a seccomp filter on socket(): a family not listed
fails with EAFNOSUPPORT. This loads the same filter (python3-seccomp, libseccomp's bindings) for
the families UNIT lists, runs the real jouled under it on 127.0.0.1:0, and asks it for its jobs
with joulectl and no token: jouled identifies such a client through NETLINK_SOCK_DIAG, so the
unit must list AF_NETLINK, and without it the answer is a 401. A control run without AF_NETLINK
checks that the filter bites (the 401 appears), so a passing run means something.
Exit 0 on success, 77 (skipped) without python3-seccomp, 1 with a FAIL line otherwise.
"""
import errno
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

try:
    import seccomp
except ImportError:
    print("SKIPPED: python3-seccomp is not installed (scripts/install-deps.sh installs it)")
    sys.exit(77)

AF_MAX = 46  # linux/socket.h (6.x); families above it do not exist


def fail(message: str) -> None:
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def unit_families(unit: str) -> set[int]:
    """The union of the unit's RestrictAddressFamilies= allow lists, as AF_* numbers."""
    names: set[str] = set()
    with open(unit, encoding="utf-8") as f:
        for line in f:
            match = re.match(r"\s*RestrictAddressFamilies=(.*)", line)
            if not match:
                continue
            value = match.group(1).split("#")[0].split()
            if not value or value[0].startswith("~") or value[0] == "none":
                fail(f"{unit}: expected an allow list in RestrictAddressFamilies=, got {match.group(1)!r}")
            names.update(value)
    if not names:
        fail(f"{unit} has no RestrictAddressFamilies=")
    unknown = [name for name in names if not hasattr(socket, name)]
    if unknown:
        fail(f"{unit}: unknown address families {unknown}")
    return {int(getattr(socket, name)) for name in names}


def restrict(allowed: set[int]):
    """A preexec_fn: socket() of any family outside `allowed` fails with EAFNOSUPPORT, as under systemd."""

    def apply() -> None:
        f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
        for family in range(AF_MAX):
            if family not in allowed:
                f.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), "socket", seccomp.Arg(0, seccomp.EQ, family))
        f.load()

    return apply


def ask_jobs(jouled: str, joulectl: str, allowed: set[int]) -> subprocess.CompletedProcess:
    """Starts jouled under the filter, runs `joulectl jobs` (no token) against it, stops it."""
    work = tempfile.mkdtemp(prefix="joule-af-", dir="/var/tmp")
    os.chmod(work, 0o755)  # jobs' directories beside the state must be reachable by their accounts
    log_path = os.path.join(work, "jouled.log")
    try:
        with open(log_path, "w") as log:
            daemon = subprocess.Popen(
                [jouled, "--listen", "127.0.0.1:0", "--state-dir", os.path.join(work, "state")],
                stdout=log, stderr=subprocess.STDOUT, preexec_fn=restrict(allowed))
        try:
            address = None
            deadline = time.monotonic() + 20
            while address is None and time.monotonic() < deadline:
                if daemon.poll() is not None:
                    fail(f"jouled exited with {daemon.returncode}:\n{open(log_path).read()}")
                match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", open(log_path).read())
                address = match.group(1) if match else None
                time.sleep(0.1)
            if address is None:
                fail(f"jouled did not start listening:\n{open(log_path).read()}")
            env = {k: v for k, v in os.environ.items() if k not in ("JOULE_TOKEN", "JOULE_SERVER")}
            return subprocess.run([joulectl, "--server", address, "jobs"], capture_output=True, text=True,
                                  timeout=30, env=env)
        finally:
            daemon.terminate()
            try:
                daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    if len(sys.argv) != 4:
        fail(f"usage: {sys.argv[0]} UNIT JOULED JOULECTL")
    unit, jouled, joulectl = sys.argv[1:]
    allowed = unit_families(unit)

    control = ask_jobs(jouled, joulectl, allowed - {socket.AF_NETLINK})
    if control.returncode == 0 or "bearer token" not in control.stderr:
        fail("control run: without AF_NETLINK jouled should not know the client and answer 401, but "
             f"joulectl exited {control.returncode}: {control.stdout}{control.stderr}")
    print(f"ok: without AF_NETLINK a loopback client gets: {control.stderr.strip()}")

    result = ask_jobs(jouled, joulectl, allowed)
    if result.returncode != 0:
        fail(f"under {unit}'s RestrictAddressFamilies= a loopback client without a token is refused: "
             f"{result.stderr.strip()}")
    print(f"ok: under {os.path.basename(unit)}'s RestrictAddressFamilies= a loopback client without a "
          "token is known by its uid")


if __name__ == "__main__":
    main()
