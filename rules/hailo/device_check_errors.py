"""device_check's errors: the HAILO_* status behind an exception and its class, transient (a
fresh process succeeds) or deterministic. Runs on the device host with device_check.py."""

from __future__ import annotations

import re
from typing import Any

TRANSIENT_STATUSES = frozenset({
    "HAILO_COMMUNICATION_CLOSED", "HAILO_DRIVER_INTERRUPTED", "HAILO_INTERRUPTED_BY_SIGNAL"})
# Python exception classes of hailo_platform that stand for one status.
STATUS_OF_CLASS = {
    "HailoCommunicationClosedException": "HAILO_COMMUNICATION_CLOSED",
    "HailoRTTimeout": "HAILO_TIMEOUT",
    "HailoRTInvalidHEFException": "HAILO_INVALID_HEF",
    "HailoRTHEFNotCompatibleWithDevice": "HAILO_HEF_NOT_COMPATIBLE_WITH_DEVICE",
    "HailoRTNotFoundException": "HAILO_NOT_FOUND",
    "HailoRTInvalidArgumentException": "HAILO_INVALID_ARGUMENT",
    "HailoRTInvalidOperationException": "HAILO_INVALID_OPERATION",
    "HailoRTDriverOperationFailedException": "HAILO_DRIVER_OPERATION_FAILED",
    "HailoRTStreamAborted": "HAILO_STREAM_ABORT",
}
STATUS_NAME = re.compile(r"\bHAILO_[A-Z0-9_]+\b")


class CheckError(Exception):
    """A failure this script detects itself (not raised by HailoRT)."""

    def __init__(self, message: str, error_class: str = "deterministic",
                 status: str | None = None):
        super().__init__(message)
        self.error_class, self.status = error_class, status


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def _status_from_code(code: Any) -> str | None:
    try:
        value = int(code)
    except (TypeError, ValueError):
        return None
    try:
        from hailo_platform.pyhailort.pyhailort import get_status_message

        name = get_status_message(value)
    except Exception:  # noqa: BLE001 - best effort: an unknown code only loses its name
        return None
    return name or None


def status_of(exc: BaseException) -> str | None:
    """The HAILO_* status behind an exception: from the exception class, the numeric status of
    the C++ exception it was raised from, or a status name in a message."""
    for link in _chain(exc):
        if isinstance(link, CheckError):
            return link.status
        name = STATUS_OF_CLASS.get(type(link).__name__)
        if name:
            return name
        if type(link).__name__ == "HailoRTStatusException" and link.args:
            name = _status_from_code(link.args[0])
            if name:
                return name
        found = STATUS_NAME.search(str(link))
        if found:
            return found.group(0)
    return None


def classify(exc: BaseException) -> dict[str, Any]:
    status = status_of(exc)
    if isinstance(exc, CheckError):
        error_class = exc.error_class
    else:
        error_class = "transient" if status in TRANSIENT_STATUSES else "deterministic"
    message = f"{type(exc).__name__}: {exc}".strip()
    causes = [f"{type(c).__name__}: {c}" for c in _chain(exc)[1:]]
    if causes:
        message += " (from " + "; ".join(causes) + ")"
    return {"class": error_class, "status": status, "message": message}
