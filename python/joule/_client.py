"""joule.Client: jouled's REST API v1 (the one joulectl speaks), standard library only."""

import json
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request

__all__ = ["ApiError", "Client", "DEFAULT_URL", "TERMINAL_STATES"]

DEFAULT_URL = "http://127.0.0.1:8571"
TERMINAL_STATES = ("succeeded", "failed", "cancelled")
_PAGE = 1000  # jouled answers at most this many jobs per GET /v1/jobs


class ApiError(Exception):
    """jouled refused a request (status: the HTTP status, detail and pointer from its
    problem+json body), or could not be reached (status None)."""

    def __init__(self, status, detail, pointer=None, body=None):
        self.status = status
        self.detail = detail
        self.pointer = pointer
        self.body = body
        text = detail if status is None else f"HTTP {status}: {detail}"
        super().__init__(text + (f" (at {pointer})" if pointer else ""))


def _problem(status, raw):
    """An ApiError from an error answer; its detail and first pointer when it is problem+json."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        body = None
    detail, pointer = f"jouled answered {status}", None
    if isinstance(body, dict):
        detail = body.get("detail") or body.get("title") or detail
        errors = body.get("errors")
        if isinstance(errors, list) and errors and isinstance(errors[0], dict):
            pointer = errors[0].get("pointer")
    return ApiError(status, detail, pointer, body)


def _read_json_file(path):
    with open(path, encoding="utf-8") as file:
        try:
            return json.load(file)
        except ValueError as error:
            raise ValueError(f"{path} is not valid JSON: {error}") from None


class Client:
    """A client of one jouled.

    url: jouled's URL; default $JOULE_SERVER (as joulectl), else $JOULE_URL (set for jobs), else
    http://127.0.0.1:8571. token: a bearer token; default $JOULE_TOKEN; without one a loopback
    client is known by its uid. ca_file: CA certificate(s) for an https:// jouled; default
    $JOULE_CA_FILE, else the system's. Every method raises ApiError when jouled refuses or
    cannot be reached.
    """

    def __init__(self, url=None, token=None, *, ca_file=None, timeout=30.0):
        url = url or os.environ.get("JOULE_SERVER") or os.environ.get("JOULE_URL") or DEFAULT_URL
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"{url}: expected http(s)://HOST:PORT")
        self.url = f"{parsed.scheme}://{parsed.netloc}"
        self.token = token if token is not None else os.environ.get("JOULE_TOKEN") or None
        self.timeout = timeout
        ca_file = ca_file or os.environ.get("JOULE_CA_FILE") or None
        self._context = ssl.create_default_context(cafile=ca_file) if parsed.scheme == "https" else None

    def __repr__(self):
        return f"joule.Client({self.url!r})"

    # -- the API --

    def submit(self, job):
        """Submits a job (a dict, or the path of a job JSON file); the job as jouled accepted it
        (its "id", "state", ...), once it is committed."""
        if isinstance(job, (str, os.PathLike)):
            job = _read_json_file(job)
        return self._json("POST", "/v1/jobs", job)

    def estimate(self, model, training=None, *, batch_size=None, epochs=None, samples_per_epoch=None, devices=None,
                 runtime=None):
        """POST /v1/estimate: shapes and counts per layer ("model") and per device an estimate or
        "no-model" ("estimates"). `model` is a spec dict or a path (a spec file, or a job file
        whose "model" is taken); `training` a dict, or given by the keywords. runtime="python"
        adds each device's measured interpreter start-up and per-step cost (a training script's);
        None or "none" adds nothing (a built-in job)."""
        if isinstance(model, (str, os.PathLike)):
            model = _read_json_file(model)
            if "model" in model and "layers" not in model:
                training = training or model.get("training")
                model = model["model"]
        training = dict(training or {})
        for key, value in (("batch_size", batch_size), ("epochs", epochs), ("samples_per_epoch", samples_per_epoch)):
            if value is not None:
                training[key] = value
        request = {"model": model, "training": training}
        if devices is not None:
            request["devices"] = [devices] if isinstance(devices, str) else list(devices)
        if runtime is not None:
            request["runtime"] = runtime
        return self._json("POST", "/v1/estimate", request)

    def job(self, job_id):
        """One job with its events, energy, estimate, progress and projection."""
        return self._json("GET", f"/v1/jobs/{_quote(job_id)}")

    def jobs(self, state=None, limit=None, *, page_size=_PAGE):
        """Jobs in submission order (only those in `state` if given), following jouled's pages
        (of `page_size`, at most 1,000) up to `limit` (all when None)."""
        listed, after = [], None
        while True:
            wanted = page_size if limit is None else min(page_size, limit - len(listed))
            if wanted <= 0:
                return listed
            query = {"limit": wanted}
            if state:
                query["state"] = state
            if after:
                query["after"] = after
            page = self._json("GET", "/v1/jobs?" + urllib.parse.urlencode(query))
            listed.extend(page.get("jobs", []))
            after = page.get("next")
            if not after:
                return listed

    def wait(self, job_id, timeout=None, poll_seconds=0.2):
        """Polls until the job is succeeded, failed or cancelled; that job. TimeoutError after
        `timeout` seconds (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job.get("state") in TERMINAL_STATES:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} is still {job.get('state')} after {timeout} s")
            time.sleep(poll_seconds)

    def cancel(self, job_id):
        """Cancels a job: its state after the request ("cancelled" at once if it was queued)."""
        return self._json("DELETE", f"/v1/jobs/{_quote(job_id)}")

    def logs(self, job_id, stream="stdout", tail_bytes=None):
        """A job's output (stream "stdout" or "stderr") as text, all of it up to its size at the
        first answer, or only its last `tail_bytes`."""
        base = f"/v1/jobs/{_quote(job_id)}/log?stream={_quote(stream)}"
        target = base + (f"&tail_bytes={int(tail_bytes)}" if tail_bytes is not None else "&offset=0")
        chunks, end = [], None
        while True:
            status, headers, body = self._request("GET", target)
            chunks.append(body)
            if tail_bytes is not None or not body:
                break
            next_offset, size = headers.get("Joule-Log-Next-Offset"), headers.get("Joule-Log-Size")
            if next_offset is None or size is None:
                break
            end = int(size) if end is None else end
            if int(next_offset) >= end:
                break
            target = f"{base}&offset={int(next_offset)}"
        return b"".join(chunks).decode("utf-8", errors="replace")

    def devices(self):
        """GET /v1/devices: devices, meters, power, energy and energy models."""
        return self._json("GET", "/v1/devices")

    # -- transport --

    def _json(self, method, target, body=None):
        _, _, raw = self._request(method, target, body)
        try:
            return json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise ApiError(None, f"jouled at {self.url} answered {method} {target} with something that is not "
                                 "JSON") from None

    def _request(self, method, target, body=None):
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(self.url + target, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self._context) as answer:
                return answer.status, answer.headers, answer.read()
        except urllib.error.HTTPError as error:
            raise _problem(error.code, error.read()) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise ApiError(None, f"cannot reach jouled at {self.url}: {reason}") from None


def _quote(text):
    return urllib.parse.quote(str(text), safe="")
