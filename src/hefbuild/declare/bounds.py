"""The store's bounds as people write them: `doit gc --max-size 10G --max-age 30d`, and the
same values under `[gc]` in hefbuild.toml."""

from __future__ import annotations

import re

from ..errors import SpecError

_SIZE_UNITS = {"": 1, "b": 1} | {
    f"{p}{suffix}": base**i
    for i, p in enumerate("kmgt", 1)
    for suffix, base in (("", 1024), ("ib", 1024), ("b", 1000))
}
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_NUMBER = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)")


def parse_size(text: str, option: str = "--max-size") -> int:
    """Bytes: `0`, `1500`, `500M`, `10G`, `2.5GiB` (K/M/G/T and KiB… are 1024s, KB… 1000s)."""
    found = _NUMBER.fullmatch(text.strip().lower())
    if found is None or found.group(2) not in _SIZE_UNITS:
        raise SpecError(option, "", f"a size such as 10G, 500M, 2.5GiB or 0, got {text!r}")
    return int(float(found.group(1)) * _SIZE_UNITS[found.group(2)])


def parse_age(text: str, option: str = "--max-age") -> float:
    """Seconds: `30d`, `12h`, `90m`, `45s`, `2w`, or `0`."""
    found = _NUMBER.fullmatch(text.strip().lower())
    if found is not None and found.group(2) in _AGE_UNITS:
        return float(found.group(1)) * _AGE_UNITS[found.group(2)]
    if found is not None and found.group(2) == "" and float(found.group(1)) == 0:
        return 0.0
    raise SpecError(option, "", f"an age such as 30d, 12h or 90m, got {text!r}")
