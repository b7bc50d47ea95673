"""Does a host answer on a TCP port? One connection attempt, bounded in time, for the run's
preflight (engine/preflight.py): a device host that does not answer now fails the check at
the end of the chain, hours later, so the run says so before it starts."""

from __future__ import annotations

import socket
import threading

REACH_TIMEOUT_S = 3.0  # a LAN host answers in milliseconds; mDNS (`*.local`) in well under 1 s


def tcp_problem(host: str, port: int, timeout: float = REACH_TIMEOUT_S) -> str:
    """Why `host:port` cannot be reached ("" when it accepts a connection). The attempt runs
    in a daemon thread because name resolution takes no timeout of its own: a resolver that
    hangs is given up on after `timeout` and left to finish alone."""
    answer: list[str] = []

    def attempt() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                answer.append("")
        except OSError as exc:
            answer.append(exc.strerror or str(exc) or type(exc).__name__)

    thread = threading.Thread(target=attempt, name=f"reach {host}:{port}", daemon=True)
    thread.start()
    thread.join(timeout)
    return answer[0] if answer else f"no answer within {timeout:g} s"
