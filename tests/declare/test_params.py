"""Each parameter type takes the values it names and refuses the others with what it
expected and what it got."""

from __future__ import annotations

import math

import pytest

from hefbuild.declare.params import ParamDef, ParamType, check_value

FITS = {
    ParamType.INT: ([0, -3, 10**12], [1.0, True, "1", None]),
    ParamType.FLOAT: ([0, 1.5, -2], [math.inf, math.nan, False, "1.5"]),
    ParamType.BOOL: ([True, False], [0, 1, "true"]),
    ParamType.STR: (["", "x"], [1, None, ["x"]]),
    ParamType.FILE: (["data/x.txt"], ["", 3]),
    ParamType.STR_LIST: ([[], ["a", "b"]], [["a", 1], "a", None]),
    ParamType.DURATION: ([90, "90s", "15m", "6h", 1.5], ["", "-1s", "soon", True, math.inf]),
    ParamType.SIZE: ([512, "512m", "24g", "1GiB"], ["0", "-1k", "big", False]),
}


def test_every_type_has_its_check():
    assert set(FITS) == set(ParamType)


@pytest.mark.parametrize("ptype", list(ParamType), ids=lambda t: t.name)
def test_a_type_takes_its_values_and_names_the_others(ptype: ParamType):
    good, bad = FITS[ptype]
    for value in good:
        assert check_value(value, ParamDef(ptype)) is None, value
    for value in bad:
        problem = check_value(value, ParamDef(ptype))
        assert problem == f"{ptype.value}, got {type(value).__name__} {value!r}", value
