"""``sweep --budget`` takes ``--other`` as ``plan`` does, and a memory size typed without a
unit that is implausibly small (``--other 58``: 58 bytes) is warned about on stderr."""

from __future__ import annotations

import pytest

from memprobe.commands.flags import warn_if_unitless

SWEEP = ["sweep", "--tokens", "1024", "--vocab", "4096", "--kernel", "unchunked,local_chunked",
         "--chunk-size", "256", "--device", "meta", "--no-verify"]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "warned"),
    [
        ("58", "--other 58 has no unit, so it is 58 B; for gibibytes write 58GiB"),
        ("80", "so it is 80 B"),
        (" 1_000 ", "so it is 1,000 B; for gibibytes write 1_000GiB"),
        ("1,024", "so it is 1.00 KiB"),
        ("1.5", "so it is 1 B"),
        ("1048575", "1,024.00 KiB"),  # just under 1 MiB
        ("1048576", None),  # 1 MiB: plausible as bytes
        ("0", None),  # nothing held: the default
        ("58GiB", None),
        ("58 b", None),  # a unit, however small, was asked for
        ("lots", None),  # not a size: the command's error, not a warning
        ("1" * 400, None),  # too large to be a size: the command's error too
        (None, None),
    ],
)
def test_unitless_small_sizes_warn(capsys, text, warned):
    warn_if_unitless(text, "--other")
    err = capsys.readouterr().err
    if warned is None:
        assert err == ""
    else:
        assert err.startswith("memprobe: warning: ") and warned in err
        assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        (["plan", "--vocab", "2048", "--kernel", "unchunked", "--no-reserved", "--budget", "80MiB"],
         ["--other", "58"]),
        (["plan", "--vocab", "2048", "--kernel", "unchunked", "--no-reserved", "--budget", "80"],
         []),
    ],
)  # fmt: skip
def test_plan_warns_and_still_runs(run_cli, command, flag):
    code, out, err = run_cli(*command, *flag)
    assert "has no unit" in err
    assert code == 0 or "nothing fits" in out or code == 2


@pytest.mark.parametrize(
    ("budget", "other", "limit", "fits"),
    [
        ("80MiB", "50MiB", "30.00 MiB", ["no", "yes"]),  # unchunked 56 MiB, local 20.01 MiB
        ("80MiB", "79MiB", "1.00 MiB", ["no", "no"]),
    ],
)
def test_sweep_budget_takes_other(run_cli, tmp_path, budget, other, limit, fits):
    code, out, err = run_cli(*SWEEP, "--out", str(tmp_path / "r"), "--budget", budget,
                             "--other", other)  # fmt: skip
    assert code == 0, err
    lines = out.splitlines()
    assert f"budget {budget[:2]}.00 MiB - other {other[:2]}.00 MiB = {limit} for the " in out
    rows = [line.split() for line in lines if line.startswith(("unchunked ", "local_chunked "))]
    assert [r[-1] for r in rows] == fits
    assert f"Fit the {limit} budget" in out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--other", "5GiB"], "--other needs --budget"),
        (["--budget", "1GiB", "--other", "2GiB"], "is more than --budget"),
        (["--budget", "1GiB", "--other", "1GiB"], "leaves nothing of --budget"),
        (["--budget", "1GiB", "--other", "lots"], "--other 'lots' is not a size"),
    ],
)
def test_sweep_other_mistakes_are_one_line(run_cli, tmp_path, args, says):
    code, out, err = run_cli(*SWEEP, "--out", str(tmp_path / "r"), *args)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()  # refused before anything ran
