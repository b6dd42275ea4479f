"""Joule for PyTorch users: model specs from real models, jobs, and progress reports.

- joule.spec(model, example_input): a torch nn.Module, traced with torch.fx, as a Joule model
  spec (the JSON that jobs and POST /v1/estimate take). Anything Joule cannot describe exactly
  is a joule.SpecError of one line naming the module path and the op.
- joule.Client(url, token): submit, estimate, list, wait for, cancel jobs and read their logs
  over jouled's REST API (errors: joule.ApiError with the HTTP status, detail and pointer).
- joule.progress(epoch, of=N): from a training loop, "epoch k of N done" to the jouled running
  the job; returns STEP's energy projection. Outside jouled it does nothing.
- python3 -m joule spec|submit: the same from a shell.

Pure Python (standard library); torch is imported only when a spec is made. Jobs that jouled
runs find this package on their PYTHONPATH.
"""

from ._client import DEFAULT_URL, TERMINAL_STATES, ApiError, Client
from ._progress import progress
from ._spec import OPTIMIZERS, SpecError, dumps, optimizer_name, spec

__all__ = ["ApiError", "Client", "DEFAULT_URL", "OPTIMIZERS", "SpecError", "TERMINAL_STATES", "dumps",
           "optimizer_name", "progress", "spec"]
__version__ = "0.1.0"
