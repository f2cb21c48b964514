"""Typed errors of the operator: what a failed step means for the retry loop.

Where it sits: ``kube`` raises these from API failures, ``spec`` raises
``InvalidSpecError`` for jobs the CRD schema let through but the operator
cannot run; the reconciler decides on retry or give-up by type alone.
"""

from __future__ import annotations


class OperatorError(Exception):
    """Base class of every error the operator raises on purpose."""


class RetryableError(OperatorError):
    """Transient: API timeouts, 5xx, 429, optimistic-lock conflicts. Retry with backoff."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ConflictError(RetryableError):
    """The object changed under us (409 on update): re-read and re-plan."""


class NotLeaderError(RetryableError):
    """A write refused before it was sent: this replica does not lead (any more).

    The reconciler retries the pass like any transient failure; its workers then
    wait on the leader gate, so the retry runs only if this replica leads again.
    """


class PermanentError(OperatorError):
    """Retrying the same request cannot succeed (403, 422, bad spec)."""


class AccessDeniedError(PermanentError):
    """The authorizer (RBAC) refused the operator's own identity (403 "cannot ...").

    Distinct from other 403s (Pod Security admission, a terminating namespace):
    it says the operator's rights are gone, which is what ``helm uninstall``
    does while the operator pod is still stopping, so the reconciler reports it
    once instead of once per job and pass.
    """


class RefusedError(PermanentError):
    """The API server refused an object we asked it to create (400, 422, or a 403
    from admission such as Pod Security), with the server's own message.

    The reconciler turns it into a condition and an Event on the job instead
    of failing the pass (see ``planning.steps.children.refusals``).
    """

    def __init__(self, detail: str, code: int, server_message: str) -> None:
        super().__init__(detail)
        self.code = code
        self.server_message = server_message


class NotOursError(PermanentError):
    """An object exists under the name the operator would give its own, and is not
    owned by the job (a user's PodDisruptionBudget named like the job): the operator
    neither patches nor deletes it, and says so on the job."""


class ApiAbsentError(PermanentError):
    """The API answered 404 for an optional group version's object (PodGroups on a
    cluster without the Workload API): the caller falls back instead of failing."""


class InvalidSpecError(PermanentError):
    """The job's spec cannot be run (the schema should have caught it)."""
