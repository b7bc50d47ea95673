"""Gathering a file's mistakes instead of stopping at the first.

A loader runs each independent check under `Mistakes.check()`; a `SpecError` raised there is
kept and the loader goes on with the next check. `raise_any()` then raises them together
(`SpecErrors`: one line each), or nothing when the file was right. Checks that later ones
depend on (the target a model names, before its stages) stay outside, so nothing is
reported about what could not be read.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import SpecError, spec_error


class Mistakes:
    def __init__(self) -> None:
        self.found: list[SpecError] = []

    @contextmanager
    def check(self) -> Iterator[None]:
        try:
            yield
        except SpecError as exc:
            self.found.append(exc)

    def raise_any(self) -> None:
        if self.found:
            raise spec_error(self.found)
