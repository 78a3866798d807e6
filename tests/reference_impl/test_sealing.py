"""Contract section 9: sensitive fields sealed at rest; an object that names
the sealed mark is kept only when it is a sealed value of this worker's."""

from __future__ import annotations

import os

import pytest

from reference_impl.sealing import Sealer


def test_a_sensitive_field_is_sealed_and_opens_again() -> None:
    sealer = Sealer(os.urandom(32))
    sealed = sealer.seal({"billing": {"payment_token": "ct_1"}, "amount": 10})
    assert set(sealed["billing"]["payment_token"]) == {"$sealed"}
    assert sealer.seal(sealed) == sealed  # already sealed: kept as it is
    assert sealer.open(sealed) == {"billing": {"payment_token": "ct_1"}, "amount": 10}


@pytest.mark.parametrize(
    "forged",
    [
        {"card_number": {"$sealed": "ct_in_clear"}},  # a clear value as the token
        {"billing": {"$sealed": "v1:AAAA", "payment_token": "ct_beside"}},  # beside the mark
        {"card_number": {"$sealed": "v1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}},  # opens under no key
        {"notes": {"$sealed": 42}},
    ],
)
def test_an_object_naming_the_mark_that_is_no_sealed_value_is_refused(forged: object) -> None:
    with pytest.raises(ValueError):
        Sealer(os.urandom(32)).seal(forged)


def test_a_value_sealed_under_another_key_is_refused() -> None:
    other = Sealer(os.urandom(32)).seal({"customer_token": "ct_2"})
    with pytest.raises(ValueError):
        Sealer(os.urandom(32)).seal(other)


def test_a_worker_without_a_key_carries_a_sealed_value_it_cannot_open() -> None:
    sealed = Sealer(os.urandom(32)).seal({"customer_token": "ct_3"})
    assert Sealer(None).seal(sealed) == sealed
    with pytest.raises(ValueError):
        Sealer(None).seal({"customer_token": {"$sealed": "ct_in_clear"}})
