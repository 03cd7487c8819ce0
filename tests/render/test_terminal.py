"""The sweep's terminal output ends with the answer, and says what fits a budget."""

from __future__ import annotations


def sweep(run_cli, tmp_path, *extra: str) -> list[str]:
    code, out, err = run_cli(
        "sweep", "--no-report",
        "--tokens", "4096", "--vocab", "32768", "--no-ladder", "--device", "meta",
        "--kernel", "unchunked,local_chunked,filtered", "--no-verify", "--out",
        str(tmp_path / "run"), *extra,
    )  # fmt: skip
    assert code == 0, err
    return out.splitlines()


def test_peak_vs_unchunked_reads_as_a_fraction_of_unchunked(run_cli, tmp_path) -> None:
    lines = sweep(run_cli, tmp_path)
    header = lines[0]
    assert "peak vs unchunked" in header and "fits" not in header
    row = {
        line.split()[0]: line
        for line in lines
        if line.split()[:1] in (["local_chunked"], ["filtered"])
    }
    # local_chunked uses less memory than unchunked (< 1x), filtered more (> 1x).
    assert " 0.36x " in row["local_chunked"]
    assert " 2.50x " in row["filtered"]


def test_last_lines_state_the_answer_and_what_fits(run_cli, tmp_path) -> None:
    lines = sweep(run_cli, tmp_path, "--budget", "1GiB")
    assert lines[0].rstrip().endswith("fits")
    local = next(line for line in lines if line.startswith("local_chunked "))
    unchunked = next(line for line in lines if line.startswith("unchunked "))
    assert local.rstrip().endswith("yes") and unchunked.rstrip().endswith("no")
    answer = "\n".join(lines[-6:])
    assert "At 4,096 tokens x 32,768 vocabulary (bf16):" in answer
    assert "Lowest peak: local_chunked, 640.04 MiB" in answer
    assert "Fit the 1.00 GiB budget: local_chunked. Over it: unchunked (1.75 GiB)" in answer


def test_answer_names_the_configurations_it_leaves_out(run_cli, tmp_path) -> None:
    lines = sweep(run_cli, tmp_path, "--dtype", "bf16,fp32")
    assert any("the run also has dtype fp32" in line for line in lines[-4:])
