"""A size in bytes is a whole number: ``1.5`` (no unit, so bytes) was read as 1 and
``0.5`` as 0, where the user most likely left out a unit. Fractions of a larger unit
are whole bytes' worth and stay as they were."""

from __future__ import annotations

import pytest

from memprobe.errors import UserError
from memprobe.io.sizes import parse_size

REFUSED = ["1.5", "0.5", " 2.25 ", "1.5B", "0.4 b", "1_000.5", 1.5, 0.25, 1e-3]
READ = {"3.0": 3, 2.0: 2, "1,000": 1000, "1.5KiB": 1536, "0.0001GiB": 107374, "2.5 kB": 2500}


@pytest.mark.parametrize("value", REFUSED, ids=[repr(v) for v in REFUSED])
def test_a_fraction_of_a_byte_is_refused(value: object) -> None:
    with pytest.raises(UserError, match="not a whole number of bytes") as exc:
        parse_size(value, what="--other")
    assert "give a unit, e.g. 1.5GiB" in exc.value.one_line()


@pytest.mark.parametrize("value", sorted(READ, key=repr), ids=repr)
def test_whole_bytes_and_fractions_of_units_are_read(value: object) -> None:
    assert parse_size(value, what="--other") == READ[value]
