"""A headless Chromium for the tests, driven over the DevTools protocol through a pipe.

`--remote-debugging-pipe` makes Chromium read protocol messages from descriptor 3 and write
them to descriptor 4, each a JSON object ended by a NUL byte: no port to find, no WebSocket
library, nothing left listening. Every console message, uncaught exception and browser log
entry of the page (failed loads, Content-Security-Policy refusals) is collected, so a test can
demand that a page loads cleanly.

Debian's `chromium` package; CHROMIUM=/path picks another binary. `chromium_binary()` is None
where there is none, for the test to skip, saying so.
"""

import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time

FLAGS = [
    "--headless", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
    "--disable-extensions", "--disable-sync", "--disable-background-networking",
    "--disable-component-update", "--disable-default-apps", "--mute-audio", "--password-store=basic",
    "--remote-debugging-pipe",
]


def chromium_binary():
    candidate = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    return candidate if candidate and os.access(candidate, os.X_OK) else None


def _high_descriptor(fd):
    """The same pipe end above 9 and close-on-exec, so that putting the child's ends at 3 and 4
    cannot overwrite one with the other."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


class Chromium:
    """One headless Chromium with one page; close() (or the with block) ends it."""

    def __init__(self, binary=None, log_path=None):
        binary = binary or chromium_binary()
        if binary is None:
            raise RuntimeError("no chromium binary")
        self.profile = tempfile.mkdtemp(prefix="joule-chromium-")
        to_browser_read, self._to_browser = map(_high_descriptor, os.pipe())
        self._from_browser, from_browser_write = map(_high_descriptor, os.pipe())

        def descriptors():  # in the child, before exec: its ends at 3 and 4, inherited
            os.dup2(to_browser_read, 3)
            os.dup2(from_browser_write, 4)

        flags = FLAGS + [f"--user-data-dir={self.profile}"]
        if os.geteuid() == 0:
            flags.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox
        self.log_path = log_path or os.path.join(self.profile, "chromium.log")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen([binary, *flags, "about:blank"], stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=log, preexec_fn=descriptors, close_fds=False)
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._buffer = b""
        self._next_id = 0
        self.events = []  # every protocol event of the page, in order
        try:
            target = self.call("Target.createTarget", {"url": "about:blank"}, timeout=60)["targetId"]
            self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Runtime", "Log", "Page"):
                self.call(f"{domain}.enable", session=True)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ protocol

    def _send(self, method, params, session):
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _receive(self, timeout):
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            readable, _, _ = select.select([self._from_browser], [], [], remaining)
            if not readable:
                return None
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError(f"chromium closed its DevTools pipe; its log: {self.log()}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method, params=None, session=False, timeout=30):
        """Sends one command and returns its result, keeping the events that arrive meanwhile."""
        wanted = self._send(method, params, session)
        deadline = time.monotonic() + timeout
        while True:
            message = self._receive(max(0.0, deadline - time.monotonic()))
            if message is None:
                raise TimeoutError(f"chromium did not answer {method} within {timeout} s")
            if message.get("id") == wanted:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def pump(self, seconds):
        """Collects events for a while."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            message = self._receive(remaining)
            if message is not None and "method" in message:
                self.events.append(message)

    # ------------------------------------------------------------------ the page

    def navigate(self, url, timeout=30):
        self.call("Page.navigate", {"url": url}, session=True)
        self.wait_for_event("Page.loadEventFired", timeout)

    def reload(self, timeout=30):
        self.call("Page.reload", {"ignoreCache": True}, session=True)
        self.wait_for_event("Page.loadEventFired", timeout)

    def wait_for_event(self, method, timeout):
        start = len(self.events)
        deadline = time.monotonic() + timeout
        while not any(event["method"] == method for event in self.events[start:]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {timeout} s")
            self.pump(0.1)

    def evaluate(self, expression):
        """The value of a JavaScript expression in the page (awaited if it is a promise)."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True},
                           session=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_until(self, what, expression, timeout=30):
        """Polls a JavaScript expression until it is truthy, and returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout} s waiting for {what}; the page's text:\n"
                                   f"{self.evaluate('document.body.innerText')}\nconsole: {self.console_errors()}")
            self.pump(0.2)

    def console_errors(self):
        """Everything the browser would show as an error in the console: console.error() and
        console.assert() calls, uncaught exceptions and rejections, and log entries of level
        error (failed loads, refused by CORS or the Content-Security-Policy...)."""
        errors = []
        for event in self.events:
            params = event.get("params", {})
            if event["method"] == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                errors.append("exception: " + details.get("exception", {}).get("description", details.get("text", "")))
            elif event["method"] == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append("console." + params["type"] + ": " +
                              " ".join(str(arg.get("value", arg.get("description", ""))) for arg in params["args"]))
            elif event["method"] == "Log.entryAdded" and params["entry"]["level"] == "error":
                entry = params["entry"]
                errors.append(f"{entry['source']}: {entry['text']} ({entry.get('url', '')})")
        return errors

    def log(self):
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as file:
                return file.read()[-4000:]
        except OSError:
            return ""

    def close(self):
        if self.process.poll() is None:
            try:
                self._send("Browser.close", None, False)
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
