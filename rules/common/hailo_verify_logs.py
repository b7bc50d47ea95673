"""hailo10h verify's copy of the device's own logs into the stage log, after a failure: the
HailoRT logs `hailortcli` keeps and the client's hailort.log of the last device_check run."""

from __future__ import annotations

from common.device import TransportError
from common.hailo_verify_retry import UTILITY_TIMEOUT_S, Device

DEVICE_LOGS = ("runtime", "system_control", "nnc")


def fetch_device_logs(dev: Device) -> str | None:
    """Copy the device's own logs into the stage log; return the first line with CHECK."""
    print("---- device logs (fetched because the check failed) ----")
    texts = []
    for which in DEVICE_LOGS:
        texts.append(show(dev, f"hailortcli logs {which}", ["hailortcli", "logs", which]))
    if dev.workdir:
        log = f"{dev.workdir}/hailort.log"
        texts.append(show(dev, log, ["cat", log]))
    print("---- end of device logs ----")
    return next((line.strip() for text in texts for line in text.splitlines()
                 if "CHECK" in line), None)


def show(dev: Device, title: str, argv: list[str]) -> str:
    """One log printed under `title`; its text, or "" when it cannot be read."""
    try:
        done = dev.transport.run(argv, UTILITY_TIMEOUT_S)
    except TransportError as exc:
        print(f"== {title}: unavailable ({exc})")
        return ""
    if done.code == 127:
        print(f"== {title}: command not found on the device host")
        return ""
    print(f"== {title} (exit {done.code})")
    text = done.stdout + done.stderr
    print(text.rstrip() or "(empty)")
    return text
