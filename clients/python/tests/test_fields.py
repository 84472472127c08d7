"""The Python client covers every group setting the server declares (``tollgate._fields``,
generated from the server's declaration and checked current by the Rust suite)."""

import dataclasses

import pytest

from tollgate import Ramp
from tollgate._fields import FIELDS
from tollgate.admin import _patch
from tollgate.errors import InvalidArgument
from tollgate.models import Group

# A value each kind of setting takes, for the ones a kind alone does not say.
_EXAMPLES = {"budget_period": "hour", "dropped": "count", "quotas": {"minute": 10.0}, "ramp": Ramp(1, 10, 5.0), "parent": "p"}


def _example(name: str) -> object:
    kind, low, high, _ = FIELDS[name]
    if name in _EXAMPLES:
        return _EXAMPLES[name]
    if kind == "flag":
        return True
    if kind == "whole":
        return int(high)
    return float(high)


def test_the_group_model_has_every_declared_setting_and_no_other() -> None:
    fields = {f.name for f in dataclasses.fields(Group)} - {"name"}
    assert fields == set(FIELDS)


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_each_declared_setting_is_taken_at_its_greatest(name: str) -> None:
    _patch({name: _example(name)})


@pytest.mark.parametrize("name", [n for n, (kind, _, _, _) in FIELDS.items() if kind == "whole"])
def test_a_whole_number_past_its_range_is_refused_naming_it(name: str) -> None:
    _, _, high, _ = FIELDS[name]
    assert high is not None
    with pytest.raises(InvalidArgument) as e:
        _patch({name: int(high) + 1})
    assert name in str(e.value)
