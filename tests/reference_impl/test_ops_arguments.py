"""The Python ops interface takes an integer argument only as a JSON integer."""

from __future__ import annotations

from typing import Any

import pytest

from reference_impl.ops import _whole


@pytest.mark.parametrize("value", [True, False, 3.0, 3.7, "3", [3], {"n": 3}])
def test_an_integer_argument_that_is_no_json_integer_is_refused(value: Any) -> None:
    # int() took true for 1 and "3" for 3, where the Go worker refuses both.
    with pytest.raises(ValueError, match="must be a JSON integer"):
        _whole({"epoch": value}, "epoch")


def test_null_or_absent_takes_the_default_and_a_required_one_is_missing() -> None:
    assert _whole({"max_attempts": None}, "max_attempts", 12) == 12
    assert _whole({}, "max_attempts", 12) == 12
    assert _whole({"max_attempts": 3}, "max_attempts", 12) == 3
    with pytest.raises(ValueError, match="missing argument 'epoch'"):
        _whole({"epoch": None}, "epoch")
