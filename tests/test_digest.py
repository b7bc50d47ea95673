"""A Digest is exactly 64 lowercase hex characters; anything else is refused."""

from __future__ import annotations

import pytest

from hefbuild.digest import Digest

GOOD = "0123456789abcdef" * 4


def test_a_sha256_hex_digest_is_accepted() -> None:
    assert Digest(GOOD).hex == GOOD and Digest(GOOD).short == GOOD[:12]


@pytest.mark.parametrize("bad", [
    GOOD[:-1], GOOD + "0", GOOD.upper(), GOOD[:31] + "g" + GOOD[32:], GOOD[:-1] + " ",
    " " + GOOD[1:], GOOD[:32] + "-" + GOOD[33:], GOOD[:32] + "\u0660" + GOOD[33:], "",
])
def test_anything_else_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="not a sha256 hex digest"):
        Digest(bad)
