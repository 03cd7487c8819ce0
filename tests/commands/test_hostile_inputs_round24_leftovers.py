"""Hostile inputs, round 24: what round 23 found and left (a value refused in words other
than the ones the user typed). Each row is a variant of the class. One line and exit 2,
or a sane answer."""

from __future__ import annotations

from typing import Any

import pytest
from hostile import one_line

# -- a --max-regression that is a number but no percentage: past a float (1e400), below
# zero, nan. The gate's own check echoed the float it had become: `--max-regression
# 1e400` was refused as "--max-regression inf", a value the user never typed. It is now
# refused where it is read, in the user's words.

NO_PERCENTAGE = ["1e400", "-1e400", "1e999%", "nan", "-nan", "inf", "-5", "-0.5%", " -1e-3 "]


@pytest.mark.parametrize("given", NO_PERCENTAGE)
def test_a_number_that_is_no_percentage_is_refused_as_typed(run_cli: Any, given: str) -> None:
    err = one_line(*run_cli("gate", "run", f"--max-regression={given}"))
    assert f"--max-regression {given!r} is not a percentage of zero or more" in err, err
    assert "inf" not in err.replace(given, "") and "for 5%" in err


@pytest.mark.parametrize(("given", "read"), [("0", 0.0), ("-0", 0.0), ("1e-400", 0.0), ("7%", 7.0)])
def test_a_percentage_of_zero_or_more_is_still_read(given: str, read: float) -> None:
    from memprobe.commands.gate import _percent

    assert _percent(given) == read
