"""Calls spread over a few threads, results in order: how blobs move `[cache] transfers` at a
time (presence checks, downloads, uploads)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def each(call: Callable[..., T], calls: list[tuple[Any, ...]], workers: int) -> list[T]:
    """`call(*args)` for each, up to `workers` at once, results in order. The first error is
    raised once the calls in flight have ended (none still writes after it); those not
    started are dropped."""
    workers = min(workers, len(calls))
    if workers <= 1:
        return [call(*args) for args in calls]
    from concurrent.futures import ThreadPoolExecutor  # only when blobs move

    with ThreadPoolExecutor(workers, thread_name_prefix="hefbuild-transfer") as pool:
        futures = [pool.submit(call, *args) for args in calls]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise
