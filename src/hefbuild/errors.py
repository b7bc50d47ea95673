"""One exception tree for everything hefbuild reports to a user.

    HefbuildError                 one line, no traceback, at the CLI boundary
     ├── SpecError                a declaration is wrong: file, key, what was expected
     │    └── SpecErrors          several such mistakes of one file, one line each
     ├── StageError               a stage could not produce its result
     │    ├── RuleFailed          the rule exited non-zero (its gate failed or it crashed)
     │    ├── MissingOutput       the rule exited 0 but a declared output is absent
     │    └── ToolchainMismatch   the toolchain lacks a required package version
     └── StoreError               the store is unusable (permissions, disk)
"""

from __future__ import annotations


class HefbuildError(Exception):
    """A failure explained in one line; `str(err)` is what the user sees."""

    exit_code = 1


class SpecError(HefbuildError):
    exit_code = 3

    def __init__(self, file: str, key: str, expected: str) -> None:
        self.file, self.key, self.expected = file, key, expected
        where = f"{file}: {key}" if key else file
        super().__init__(f"{where}: {expected}")


    @property
    def each(self) -> tuple[SpecError, ...]:
        return (self,)


class SpecErrors(SpecError):
    """Every mistake one pass over a file found: a headline, then one line per mistake (each
    naming the file and the key, so it reads alone), so a file with three mistakes takes one
    run to fix, not three. `file`, `key` and `expected` are the first mistake's."""

    def __init__(self, errors: list[SpecError]) -> None:
        self.errors = tuple(e for err in errors for e in err.each)
        first = self.errors[0]
        self.file, self.key, self.expected = first.file, first.key, first.expected
        lines = "\n".join(f"  {e}" for e in self.errors)
        HefbuildError.__init__(self, f"{first.file}: {len(self.errors)} mistakes\n{lines}")

    @property
    def each(self) -> tuple[SpecError, ...]:
        return self.errors


def spec_error(errors: list[SpecError]) -> SpecError:
    """One error for one mistake, else all of them."""
    flat = [e for err in errors for e in err.each]
    return flat[0] if len(flat) == 1 else SpecErrors(flat)


class StageError(HefbuildError):
    pass


class RuleFailed(StageError):
    def __init__(self, message: str, peak_rss_mb: float | None = None) -> None:
        super().__init__(message)
        self.peak_rss_mb = peak_rss_mb  # the rule's own, for the failed event


class MissingOutput(StageError):
    pass


class ToolchainMismatch(StageError):
    pass


class StoreError(HefbuildError):
    pass
