"""Reading one declaration file: TOML parsed with one-line errors, and the table checks
every loader (models, toolchains, targets) shares."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from ..errors import SpecError, spec_error

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")  # a pinned revision
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")  # a file's digest


def read_toml(path: Path, shown: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):  # imported here: a cached project parses no TOML
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(shown, "", f"malformed TOML ({exc})") from exc
    except UnicodeDecodeError as exc:
        raise SpecError(shown, "", f"not UTF-8 text (byte {exc.start}: "
                        f"{exc.object[exc.start:exc.start + 1]!r})") from exc
    except RecursionError:
        raise SpecError(shown, "", "nested too deeply to be a declaration") from None
    except OSError as exc:
        raise SpecError(shown, "", f"cannot be read ({exc.strerror})") from exc


def _table(doc: dict[str, Any], key: str, shown: str, path: str) -> dict[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise SpecError(shown, path, f"a table, got {type(value).__name__}")
    return value


def _only_keys(table: dict[str, Any], allowed: set[str] | dict, shown: str, path: str) -> None:
    names = ", ".join(sorted(allowed)) or "nothing"
    unknown = [SpecError(shown, f"{path}.{key}" if path else key,
                         f"unknown key (expected one of: {names})")
               for key in table if key not in allowed]
    if unknown:
        raise spec_error(unknown)


def table_list(doc: dict[str, Any], key: str, shown: str) -> list[dict[str, Any]]:
    value = doc.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise SpecError(shown, key, f"an array of tables ([[{key}]]), got {value!r}"[:120])
    return value


def string(table: dict[str, Any], key: str, shown: str, path: str, default: str = "") -> str:
    value = table.get(key, default)
    if not isinstance(value, str):
        raise SpecError(shown, f"{path}.{key}", f"a string, got {value!r}")
    return value


def one_of(what: str, names: list[str], got: Any) -> str:
    return f"{what} ({', '.join(names) or 'none declared'}), got {got!r}"


def names(table: dict[str, Any], key: str, where: str, shown: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise SpecError(shown, f"{where}.{key}", f"a list of names, got {value!r}"[:120])
    return tuple(value)
