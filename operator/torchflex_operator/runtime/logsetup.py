"""The operator's log: kopf's handler chatter left out, every job's lines tagged with it.

Where it sits: ``cli`` calls ``configure`` once, after kopf installed its
handler on the root logger; the reconciler's workers set ``CURRENT_JOB``
around each pass. A ``logging.Filter`` on kopf's handler then

- drops kopf's "Handler 'job_event' succeeded." lines below ``--verbose``:
  every watch event of every owned object logs one (three quarters of a busy
  operator's log), and they say nothing a failure would not;
- gives each of our records of a pass the job as ``k8s_ref``, the attribute
  kopf's own per-object records carry: its JSON format writes it as
  ``"object": {"apiVersion", "kind", "namespace", "name"}``, the same field a
  log query already uses for kopf's lines (a plain ``name`` key would clash
  with the record's logger name).
"""

from __future__ import annotations

import contextvars
import logging
import re

import kopf

from torchflex_contract import labels

CURRENT_JOB: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "torchflex_current_job", default=None
)
"""(namespace, name) of the job the running reconcile pass is about."""

_HANDLER_SUCCEEDED = re.compile(r"^Handler '[^']*' succeeded\.$")


def job_ref(namespace: str, name: str) -> dict[str, str]:
    return {
        "apiVersion": labels.API_VERSION,
        "kind": labels.KIND,
        "namespace": namespace,
        "name": name,
    }


class JobLogFilter(logging.Filter):
    def __init__(self, *, verbose: bool) -> None:
        super().__init__()
        self.verbose = verbose

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("kopf.") and _HANDLER_SUCCEEDED.match(record.getMessage()):
            return self.verbose
        if not hasattr(record, "k8s_ref") and (key := CURRENT_JOB.get()) is not None:
            record.k8s_ref = job_ref(*key)
        return True


def configure(*, verbose: bool, json: bool) -> None:
    """kopf's root handler and format, our level, and the filter on every root handler."""
    kopf.configure(
        verbose=verbose, log_format=kopf.LogFormat.JSON if json else kopf.LogFormat.PLAIN
    )
    logging.getLogger("torchflex_operator").setLevel(logging.DEBUG if verbose else logging.INFO)
    job_filter = JobLogFilter(verbose=verbose)
    for handler in logging.getLogger().handlers:
        handler.addFilter(job_filter)
