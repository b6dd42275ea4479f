"""joule.progress: a training job tells the jouled that runs it "epoch k of N is done"."""

import json
import os
import sys
import urllib.error
import urllib.request

__all__ = ["progress"]

_TIMEOUT_SECONDS = 5.0
_warned = False


def progress(epoch, of, **extra):
    """Reports that `epoch` epochs of `of` are done to the jouled running this job, and returns
    STEP's projection of the job's total energy from the answer (a dict: "joules" {"mean",
    "std"}, "method", "stable_epochs", "seconds_remaining", "source"), or None while there is
    none yet (the first epochs are warm-up) or when nothing was reported.

    Outside jouled ($JOULE_URL or $JOULE_JOB_ID unset) it does nothing and returns None, so the
    same script runs anywhere. It never raises for jouled's sake: a refusal (401 for a wrong
    or missing $JOULE_JOB_TOKEN, 409 for a job no longer running...) or an unreachable daemon
    prints one warning line on stderr, the first time only, and training goes on. `extra` keys
    (e.g. loss=0.3) travel in the report's body.
    """
    global _warned
    url, job_id = os.environ.get("JOULE_URL"), os.environ.get("JOULE_JOB_ID")
    if not url or not job_id:
        return None
    body = dict(extra)
    body.update(epoch=int(epoch), epochs=int(of))
    request = urllib.request.Request(f"{url.rstrip('/')}/v1/jobs/{urllib.request.quote(job_id, safe='')}/progress",
                                     data=json.dumps(body).encode("utf-8"), method="POST",
                                     headers={"Content-Type": "application/json"})
    token = os.environ.get("JOULE_JOB_TOKEN")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_SECONDS) as answer:
            reply = json.loads(answer.read().decode("utf-8"))
    except urllib.error.HTTPError as error:
        _warn(f"jouled refused the report of epoch {epoch} of {of} (HTTP {error.code}: {_detail(error)})")
        return None
    except Exception as error:  # noqa: BLE001 - unreachable, timed out, garbled: training goes on
        _warn(f"could not report epoch {epoch} of {of} to {url}: {getattr(error, 'reason', error)}")
        return None
    projection = reply.get("projection") if isinstance(reply, dict) else None
    if isinstance(projection, dict) and projection.get("stable_epochs", 0) > 0:
        return projection
    return None


def _detail(error):
    try:
        return json.loads(error.read().decode("utf-8")).get("detail") or error.reason
    except Exception:  # noqa: BLE001
        return error.reason


def _warn(message):
    global _warned
    if _warned:
        return
    _warned = True
    text = " ".join(f"joule.progress: {message}; training goes on (later failures are not shown)".split())
    try:
        print(text, file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001 - a closed stderr must not stop training either
        pass
