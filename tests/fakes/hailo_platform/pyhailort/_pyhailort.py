"""FAKE stand-in for the compiled `_pyhailort` extension: the status exception and the status
names (numbers as in HailoRT's hailort.h). NOT the real runtime."""

from __future__ import annotations

STATUS_NAMES = {  # the few this double raises (values from HailoRT 5.x hailort.h)
    26: "HAILO_INVALID_HEF",
    28: "HAILO_INTERRUPTED_BY_SIGNAL",
    36: "HAILO_DRIVER_OPERATION_FAILED",
    61: "HAILO_NOT_FOUND",
    62: "HAILO_COMMUNICATION_CLOSED",
    79: "HAILO_NOT_SUPPORTED",
    88: "HAILO_DRIVER_INTERRUPTED",
    91: "HAILO_HEF_FILE_CORRUPTED",
}
STATUS = {name: code for code, name in STATUS_NAMES.items()}


class HailoRTStatusException(Exception):
    """What the C++ layer raises: args[0] is the numeric hailo_status."""


def get_status_message(code: int) -> str:
    return STATUS_NAMES.get(int(code), "")
