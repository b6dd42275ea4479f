"""A real jouled for the Python tests, as tests/integration/daemon_process.cpp starts one: a
temp state directory, 127.0.0.1:0, a NOTIFY_SOCKET of the test's own that says when it is ready
and on which port.

JOULED_BINARY (set by CTest from $<TARGET_FILE:jouled>) names the binary; without it the build
tree's build/daemon/jouled is tried. Tests that need one skip with a message when neither exists.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
SOURCE_DIR = os.path.dirname(PYTHON_DIR)

# Probing would start joule-worker on the idle CPU, in the way of the tests' own work.
CONFIG = "[probing]\nenabled = false\n"


def jouled_binary():
    binary = os.environ.get("JOULED_BINARY") or os.path.join(SOURCE_DIR, "build", "daemon", "jouled")
    return binary if os.access(binary, os.X_OK) else None


def require_torch(test_case_class):
    """Skips a TestCase class, saying why, where PyTorch cannot be imported."""
    try:
        import torch  # noqa: F401
        import torchvision  # noqa: F401
    except ImportError as error:
        print(f"SKIPPED: PyTorch is not importable by {sys.executable} ({error}); on Debian: apt install "
              "python3-torch python3-torchvision", file=sys.stderr)
        return unittest.skip(f"PyTorch is not importable ({error})")(test_case_class)
    return test_case_class


def wait_for(what, predicate, timeout=30.0, interval=0.05):
    """predicate()'s first true value, polled until `timeout` seconds; AssertionError naming `what` after."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


class Jouled:
    """jouled as a child process; stop() (or the with block) kills it and removes its files."""

    def __init__(self, config=CONFIG, host="127.0.0.1", state_dir=None):
        """`state_dir`: one of the caller's, kept when it stops (for a restart on the same state)."""
        binary = jouled_binary()
        if binary is None:
            raise unittest.SkipTest("no jouled binary: build it (cmake --build build) or set JOULED_BINARY")
        # Open to others (0755): jobs run under accounts of their own and must reach their
        # directories beside the state directory.
        self.work_dir = tempfile.mkdtemp(prefix="joule-py-")
        os.chmod(self.work_dir, 0o755)
        self.state_dir = state_dir or os.path.join(self.work_dir, "state")
        config_path = os.path.join(self.work_dir, "jouled.toml")
        with open(config_path, "w", encoding="utf-8") as file:
            file.write(config)
        notify_path = os.path.join(self.work_dir, "notify.sock")
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._notify.bind(notify_path)
        self.log_path = os.path.join(self.work_dir, "jouled.log")
        env = dict(os.environ, NOTIFY_SOCKET=notify_path)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [binary, "--state-dir", self.state_dir, "--listen", f"{host}:0", "--config", config_path],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env)
        self.host = host  # another than loopback needs API tokens in the config
        self.port = self._wait_ready(timeout=30)
        self.url = f"http://{host}:{self.port}"

    def _wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"jouled exited with {self.process.returncode}: {self.log()}")
            self._notify.settimeout(0.1)
            try:
                message = self._notify.recv(4096).decode("utf-8", errors="replace")
            except socket.timeout:
                continue
            if "READY=1" in message:
                match = re.search(r"listening on [0-9.:\[\]a-f]*:([0-9]+)", message)
                if match:
                    return int(match.group(1))
        self.stop()
        raise RuntimeError(f"jouled was not ready within {timeout} s: {self.log()}")

    def log(self):
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as file:
                return file.read()
        except OSError:
            return ""

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._notify.close()
        shutil.rmtree(self.work_dir, ignore_errors=True)
        shutil.rmtree(self.state_dir + "-jobs", ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
