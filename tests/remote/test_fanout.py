"""fanout.each: calls over a few threads, results in order, the first error after the
calls in flight have ended."""

from __future__ import annotations

import random
import signal
import threading
import time

import pytest

from hefbuild.remote.fanout import each


class Calls:
    """Records how many calls run at once and which ones started."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = self.most = 0
        self.started: list[int] = []

    def __call__(self, i: int, seconds: float, fail: bool = False) -> int:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.started.append(i)
        try:
            time.sleep(seconds)
            if fail:
                raise ValueError(f"call {i}")
            return i * i
        finally:
            with self.lock:
                self.running -= 1


def test_results_come_in_order_at_most_workers_at_once() -> None:
    calls = Calls()
    rng = random.Random(7)
    args = [(i, rng.uniform(0, 0.01)) for i in range(60)]
    assert each(calls, args, 4) == [i * i for i in range(60)]
    assert calls.most == 4 and sorted(calls.started) == list(range(60))


def test_one_worker_runs_them_here_in_order() -> None:
    seen: list[str] = []
    assert each(lambda i: seen.append(threading.current_thread().name) or i,
                [(i,) for i in range(3)], 1) == [0, 1, 2]
    assert set(seen) == {threading.current_thread().name}


def test_the_first_error_in_order_is_raised_once_the_calls_in_flight_end() -> None:
    calls = Calls()
    # Call 2 fails after call 5 has failed: the error raised is call 2's, the earlier one.
    args = [(i, {2: 0.2, 5: 0.01}.get(i, 0.05), i in (2, 5)) for i in range(40)]
    with pytest.raises(ValueError, match="call 2"):
        each(calls, args, 4)
    assert calls.running == 0  # nothing still runs once it is raised
    assert len(calls.started) < 40  # the calls not started are dropped


def test_an_interrupt_waits_for_the_calls_in_flight_then_is_raised() -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("Ctrl-C reaches the main thread only")
    import _thread

    calls = Calls()

    def call(i: int) -> int:
        if i == 0:
            _thread.interrupt_main()  # Ctrl-C while the caller waits for the threads
        return calls(i, 0.2)

    # Python's own handler, whatever this process inherited (pytest under nohup ignores
    # SIGINT, and then interrupt_main does nothing)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            each(call, [(i,) for i in range(40)], 4)
    finally:
        signal.signal(signal.SIGINT, before)
    assert calls.running == 0  # nothing still runs once it is raised
    assert len(calls.started) < 40  # no new call was taken after it
