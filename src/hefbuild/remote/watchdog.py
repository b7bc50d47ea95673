"""Deadlines on socket exchanges, served by one thread for all of them.

An exchange that outlives its deadline is ended whatever it is blocked in (headers, body, a
send): the socket is shut down, so the blocked call returns at once. The idle timeout alone
lets a server that sends a byte every few seconds hold us forever.

One thread keeps every pending deadline in a heap and sleeps until the earliest. A
`threading.Timer` per exchange did the same job by starting a thread per blob: with many
small blobs in flight, starting and handing off those threads cost more than the bytes. The
thread starts with the first deadline and ends once none has been pending for `IDLE_S`.
"""

from __future__ import annotations

import heapq
import itertools
import socket
import threading
import time
from contextlib import suppress

IDLE_S = 5.0  # an idle watchdog thread lingers this long, for the next exchange


class Deadline:
    """One exchange's deadline: `expired` once the watchdog cut its socket."""

    __slots__ = ("seconds", "at", "expired", "done", "_sock")

    def __init__(self, seconds: float, sock: socket.socket | None) -> None:
        self.seconds, self.at = seconds, time.monotonic() + seconds
        self.expired = self.done = False
        self._sock = sock

    def cut(self) -> None:
        self.expired = True
        if self._sock is not None:
            with suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)


class Watchdog:
    """Cuts the socket of every exchange still armed at its deadline."""

    def __init__(self, name: str = "hefbuild-watchdog") -> None:
        self._name = name
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Deadline]] = []
        self._seq = itertools.count()  # ties on `at` never compare two Deadlines
        self._done = 0  # disarmed entries still in the heap
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float, sock: socket.socket | None) -> Deadline:
        deadline = Deadline(seconds, sock)
        with self._cond:
            heapq.heappush(self._heap, (deadline.at, next(self._seq), deadline))
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self._name,
                                                daemon=True)
                self._thread.start()
            elif self._heap[0][2] is deadline:  # earlier than the one it sleeps for
                self._cond.notify()
        return deadline

    def disarm(self, deadline: Deadline) -> None:
        """After this, the watchdog never touches the exchange's socket."""
        with self._cond:  # the lock orders this against a cut in progress
            if not deadline.done:
                deadline.done = True
                self._done += 1
                # Only when none is left, so that an idle thread ends IDLE_S after the last
                # exchange. Otherwise it wakes at the disarmed one's time, which is never
                # later than a live one's: waking it for every blob cost 3 % of a download
                # of 200 x 1 MiB (docs/transfers.md).
                if self._done == len(self._heap):
                    self._cond.notify()
                self._compact()

    def pending(self) -> int:
        """Deadlines armed and not yet disarmed or expired."""
        with self._cond:
            return len(self._heap) - self._done

    def _compact(self) -> None:
        # Disarmed entries wait in the heap for their time; rebuild before they pile up
        # (a busy build disarms thousands of deadlines that are minutes away).
        if self._done > 64 and self._done * 2 > len(self._heap):
            self._heap = [e for e in self._heap if not e[2].done]
            heapq.heapify(self._heap)
            self._done = 0

    def _serve(self) -> None:
        with self._cond:
            while True:
                self._expire_due(time.monotonic())
                if self._heap:
                    self._cond.wait(self._heap[0][0] - time.monotonic())
                elif not self._cond.wait(IDLE_S) and not self._heap:
                    self._thread = None  # the next arm starts another
                    return

    def _expire_due(self, now: float) -> None:
        while self._heap and (self._heap[0][2].done or self._heap[0][0] <= now):
            _, _, deadline = heapq.heappop(self._heap)
            if deadline.done:
                self._done -= 1
            else:
                deadline.done = True
                deadline.cut()


SHARED = Watchdog()  # every transport's exchanges: one thread per process, not per blob
