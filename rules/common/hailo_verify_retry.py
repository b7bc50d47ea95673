"""hailo10h verify's calls of device_check on the device host: one attempt is one fresh
process under the attempt timeout; only the transient class (exit 3, a timeout, a lost ssh
connection) is retried, with exponential backoff and jitter; deterministic errors (exit 4) are
not. A host that is not the declared one (`HostKeyError`) is never retried."""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

from common.device import Completed, HostKeyError, Transport, TransportError

TRANSIENT_EXIT, DETERMINISTIC_EXIT = 3, 4
UTILITY_TIMEOUT_S = 120.0  # a command other than device_check (sha256sum, logs, a local audit)


class DeviceFailure(Exception):
    """A failure on the device side: logs are fetched before the stage fails."""


@dataclass(frozen=True)
class Retry:
    attempts: int
    backoff: float
    attempt_timeout: float

    def delay(self, failed: int, rng: random.Random) -> float:
        """Before attempt failed+1: backoff * 2^(failed-1), plus up to 25 % jitter."""
        base = self.backoff * 2 ** (failed - 1)
        return base + rng.uniform(0, base / 4)


@dataclass
class Outcome:
    """What one device_check call ended with."""

    kind: str  # ok | transient | deterministic
    data: dict[str, Any]
    message: str


@dataclass
class Device:
    transport: Transport
    python: str
    root: str  # absolute remote_dir
    retry: Retry
    sleep: Any = time.sleep
    rng: random.Random = field(default_factory=random.Random)
    fake: bool = False
    attempts_log: list[dict[str, Any]] = field(default_factory=list)
    workdir: str | None = None  # where the last device_check ran (its hailort.log)

    def remote(self, *parts: str) -> str:
        return "/".join((self.root, *parts))


def classify(done: Completed) -> Outcome:
    """Sort one device_check result into ok / transient / deterministic."""
    data = last_json(done.stdout)
    error = data.get("error") if isinstance(data.get("error"), dict) else None
    if done.timed_out:
        return Outcome("transient", data, f"timed out after {done.seconds:.0f} s (killed)")
    if error is not None:
        kind = "transient" if error.get("class") == "transient" else "deterministic"
        if done.code == DETERMINISTIC_EXIT:
            kind = "deterministic"
        return Outcome(kind, data, f"{error.get('status', '?')}: {error.get('message', '')}")
    if done.code == TRANSIENT_EXIT:
        return Outcome("transient", data, f"exit 3: {tail(done)}")
    if done.code != 0 or not data:
        return Outcome("deterministic", data, f"exit {done.code}: {tail(done)}")
    return Outcome("ok", data, "ok")


def last_json(text: str) -> dict[str, Any]:
    """The last line of `text` that is a JSON object (device_check's answer), else {}."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return {}


def tail(done: Completed) -> str:
    """The last non-blank line a command printed, stderr before stdout."""
    lines = [x for x in (done.stderr + "\n" + done.stdout).splitlines() if x.strip()]
    return lines[-1].strip() if lines else "no output"


def call(dev: Device, label: str, args: list[str], cwd: str | None = None) -> Outcome:
    """device_check with retries of the transient class; every attempt logged."""
    argv = [dev.python, dev.remote("device_check.py"), *args]
    cwd = cwd or dev.root  # the client's hailort.log lands in its working directory
    dev.workdir = cwd
    outcome = Outcome("transient", {}, "not run")
    for number in range(1, dev.retry.attempts + 1):
        delay = dev.retry.delay(number - 1, dev.rng) if number > 1 else 0.0
        if delay:
            dev.sleep(delay)
        outcome = attempt(dev, argv, cwd)
        dev.attempts_log.append({"step": label, "attempt": number, "delay_s": round(delay, 2),
                                 "outcome": outcome.kind, "message": outcome.message})
        print(f"[device] {label} attempt {number}/{dev.retry.attempts} after {delay:.2f} s: "
              f"{outcome.kind} ({outcome.message})", flush=True)
        if outcome.data.get("fake"):
            dev.fake = True
        if outcome.kind != "transient":
            break
    return outcome


def attempt(dev: Device, argv: list[str], cwd: str | None) -> Outcome:
    """One fresh device_check process; a lost connection is an attempt's transient end."""
    try:
        done = dev.transport.run(argv, dev.retry.attempt_timeout, cwd=cwd)
    except HostKeyError:  # not the declared host: no retry would change that
        raise
    except TransportError as exc:  # the connection itself: worth another fresh attempt
        print(f"[device] {exc}")
        return Outcome("transient", {}, "ssh connection failed (see the stage log)")
    for line in done.stderr.splitlines()[-20:]:
        print(f"[device stderr] {line}")
    return classify(done)


def require_ok(outcome: Outcome, what: str) -> dict[str, Any]:
    """The answer of a call that ended ok, else a DeviceFailure naming `what`."""
    if outcome.kind == "ok":
        return outcome.data
    retried = " (transient, retries exhausted)" if outcome.kind == "transient" else ""
    raise DeviceFailure(f"{what} failed{retried}: {outcome.message}")
