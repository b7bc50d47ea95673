"""device_check's versions: HailoRT's and the devices' firmware release, which must be one
release and the build's pins. Runs on the device host with device_check.py."""

from __future__ import annotations

import re
from typing import Any

from device_check_errors import CheckError

VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def release(text: str) -> str | None:
    found = VERSION.search(str(text))
    return ".".join(found.groups()) if found else None


def read_versions() -> dict[str, Any]:
    import hailo_platform
    from hailo_platform import Device

    devices = [str(d) for d in Device.scan()]
    raw: dict[str, str] = {}
    for device_id in devices:
        device = Device(device_id)
        try:
            raw[device_id] = str(device.control.identify().firmware_version)
        finally:
            device.release()
    firmware = sorted({release(v) or v for v in raw.values()})
    return {"hailort": str(hailo_platform.__version__),
            "firmware": firmware[0] if len(firmware) == 1 else (firmware or None),
            "devices": devices, "firmware_by_device": raw}


def check_versions(found: dict[str, Any], expect: dict[str, str] | None) -> None:
    if not found["devices"]:
        raise CheckError("no Hailo device found (Device.scan() is empty)")
    runtime, firmware = release(found["hailort"]), found["firmware"]
    if not isinstance(firmware, str):
        raise CheckError(f"devices run different firmware: {found['firmware_by_device']}")
    if runtime is None or runtime.split(".")[:2] != firmware.split(".")[:2]:
        raise CheckError(f"HailoRT {found['hailort']} and device firmware {firmware} are not "
                         "the same release (runtime, firmware and compiler must match)")
    for key, want in (expect or {}).items():
        have = runtime if key == "hailort" else firmware if key == "firmware" else None
        if have is not None and want and have != release(want):
            raise CheckError(f"{key} is {have} on the device host; the build pins {want}")
