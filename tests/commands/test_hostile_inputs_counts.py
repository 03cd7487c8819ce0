"""Numbers no run can mean, given to the reading commands: one line, exit 2, nothing written.

Counts (a vocabulary, a --top, a device) are capped where the simulating commands cap them
(2^40); allocator settings at what torch's parser reads; a folder named with a trailing
slash is a folder, never a file of that name."""

from __future__ import annotations

from pathlib import Path

import pytest

from memprobe.allocator import parse_alloc_conf
from memprobe.errors import UserError
from memprobe.snapshot.write import write_snapshot

HUGE = "9" * 400
JUST_OVER = str(2**40 + 1)


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    path = tmp_path / "empty.pickle"
    write_snapshot({"segments": [], "device_traces": [[]]}, path)
    return path


@pytest.mark.parametrize(
    "flags",
    [
        ["--top", HUGE],
        ["--top", JUST_OVER],
        ["--vocab", HUGE],
        ["--tokens", JUST_OVER],
        ["--batch", HUGE],
        ["--device", HUGE],
        ["--what-if", "local_chunked", "--chunk-size", HUGE],
    ],
)
def test_attribute_refuses_counts_beyond_any_run(run_cli, snapshot: Path, flags: list[str]) -> None:
    code, out, err = run_cli("attribute", str(snapshot), *flags)
    assert code == 2, (out, err)
    assert "less than or equal to 1099511627776" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("flags", [["--top", HUGE], ["--device", JUST_OVER]])
def test_diff_refuses_counts_beyond_any_run(run_cli, snapshot: Path, flags: list[str]) -> None:
    code, _, err = run_cli("diff", str(snapshot), str(snapshot), *flags)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "text",
    [
        f"max_split_size_mb:{HUGE}",
        f"max_non_split_rounding_mb:{HUGE}",
        f"roundup_power2_divisions:{HUGE}",
        f"roundup_power2_divisions:[256:{HUGE}]",
        f"max_split_size_mb:{2**44}",
        f"max_split_size_mb:-{HUGE}",
    ],
)
def test_allocator_settings_beyond_64_bits_are_refused(text: str) -> None:
    with pytest.raises(UserError) as caught:
        parse_alloc_conf(text)
    assert "beyond what the allocator reads" in caught.value.one_line()
    assert HUGE not in caught.value.message.split(":", 1)[-1].split("'")[-1]


def test_allocator_settings_at_real_sizes_still_read() -> None:
    assert parse_alloc_conf("max_split_size_mb:512").to_string() == "max_split_size_mb:512"


def test_report_out_with_a_trailing_slash_is_a_folder(run_cli, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    code, _, err = run_cli("report", str(tmp_path), "--out", f"{missing}/")
    assert code == 2
    assert "no such folder" in err
    assert not missing.exists()  # no file named like the folder
