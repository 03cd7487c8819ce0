"""``memprobe plan`` on the command line: table and answer, --json, --out, bad budgets."""

from __future__ import annotations

import json

import pytest

SMALL = ["--vocab", "2048", "--chunk-size", "256", "--jobs", "1"]


def test_table_ends_with_the_answer(run_cli):
    code, out, err = run_cli(
        "plan", *SMALL, "--budget", "32MiB", "--kernel", "unchunked,local_chunked"
    )
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0].startswith("budget 32.00 MiB - other 0 B = 32.00 MiB")
    assert lines[1].split()[:5] == ["kernel", "tp", "cp", "chunk", "tokens/GPU"]
    assert lines[-1].startswith("answer: with 32.00 MiB for the step, local_chunked fits the most:")
    assert "unchunked fits" in lines[-1]
    assert any(line.startswith("reserved: planned on memprobe's model") for line in lines)


def test_json_rows(run_cli):
    code, out, err = run_cli(
        "plan",
        *SMALL,
        "--budget",
        "40MiB",
        "--other",
        "32MiB",
        "--kernel",
        "chunked_distributed",
        "--tp",
        "1,2",
        "--cp",
        "1,4",
        "--json",
    )
    assert code == 0, err
    rows = json.loads(out)
    assert len(rows) == 4
    for row in rows:
        assert {
            "kernel",
            "tp",
            "cp",
            "max_tokens",
            "peak_bytes_at_max",
            "budget_bytes",
            "other_bytes",
        } <= set(row)
        assert row["budget_bytes"] == 40 * 2**20 and row["other_bytes"] == 32 * 2**20
        assert row["peak_bytes_at_max"] <= row["limit_bytes"] < row["peak_bytes_above_max"]
        assert row["global_tokens"] == row["max_tokens"] * row["cp"]
    by_tp = {row["tp"]: row["max_tokens"] for row in rows if row["cp"] == 1}
    assert by_tp[2] > by_tp[1]  # half the vocabulary per rank: more tokens fit


def test_out_writes_an_offline_page(run_cli, tmp_path):
    code, out, err = run_cli(
        "plan", *SMALL, "--budget", "32MiB", "--kernel", "local_chunked", "--out", str(tmp_path)
    )
    assert code == 0, err
    page = (tmp_path / "plan.html").read_text()
    assert "data:image/png;base64," in page and "http" not in page.replace("http-equiv", "")
    assert (tmp_path / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "plan.json").read_text())[0]["kernel"] == "local_chunked"


def test_page_escapes_text():
    from memprobe.plan import Budget, Line, PlanTarget, Search, TokenPlan
    from memprobe.render.plan_page import page_html

    search = Search(10, 100, 200, Line(10.0, 0.0), 10, 4, ((10, 100), (11, 200)))
    target = PlanTarget("unchunked", 64)
    object.__setattr__(target, "kernel", "<script>x</script>")  # past the check: text to escape
    p = TokenPlan(target, Budget(150), search)
    page = page_html([p], Budget(150), b"", "answer: <b>")
    assert "<script>x" not in page and "&lt;script&gt;" in page and "&lt;b&gt;" in page


def test_nothing_fits_is_exit_zero(run_cli):
    code, out, err = run_cli("plan", *SMALL, "--budget", "1GiB", "--other", "1GiB")
    assert code == 0, err
    assert out.strip().splitlines()[-1].startswith("answer: nothing fits: one token per GPU")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--budget", "-80GiB"], "is negative"),
        (["--budget", "10GiB", "--other", "54GiB"], "is more than --budget"),
        (["--budget", "eighty"], "is not a size"),
        (["--budget", "80GiB", "--tp", "3"], "does not divide"),
        (["--budget", "80GiB", "--kernel", "unchunked", "--tp", "2"], "can shard"),
        (["--budget", "80GiB", "--batch", "1,2"], "takes one value"),
        # a one-value flag's hint shows one value, not a comma list it would refuse
        (["--budget", "80GiB", "--batch", "two"], "is not a whole number (e.g. --batch 2)"),
        (["--budget", "80GiB", "--from-run", "/nonexistent/run"], "no results"),
    ],
)
def test_user_mistakes_are_one_line_exit_2(run_cli, args, says):
    code, out, err = run_cli("plan", *SMALL, *args)
    assert code == 2
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_docs_show_what_the_command_prints(run_cli):
    """The README's long-context example is this command's output, answer included."""
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "README.md").read_text()
    code, out, err = run_cli(
        "plan", "--vocab", "131072", "--budget", "80GiB", "--other", "54GiB", "--jobs", "1"
    )
    assert code == 0, err
    assert out.strip() in doc


def test_no_reserved_plans_on_allocated_bytes_only(run_cli):
    code, out, err = run_cli(
        "plan", *SMALL, "--budget", "32MiB", "--kernel", "local_chunked", "--no-reserved"
    )
    assert code == 0, err
    assert "reserved: not planned (--no-reserved)" in out
    assert "tokens (reserved)" not in out


def test_each_finished_plan_is_reported_on_stderr(run_cli):
    import json

    code, out, err = run_cli(
        "plan", *SMALL, "--budget", "32MiB", "--kernel", "local_chunked,unchunked", "--json"
    )
    assert code == 0, err
    rows = json.loads(out)  # stdout stays the JSON alone
    lines = err.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["[1/2]", "[2/2]"]
    for row in rows:
        assert f"{row['kernel']} tp=1 cp=1: {row['max_tokens']:,} tokens/GPU" in err


def test_several_sequences_per_gpu_say_the_count_is_per_sequence(run_cli):
    code, out, err = run_cli(
        "plan", "--vocab", "4096", "--budget", "256MiB", "--kernel", "local_chunked",
        "--batch", "2", "--no-reserved",
    )  # fmt: skip
    assert code == 0, err
    header = next(line for line in out.splitlines() if line.startswith("kernel"))
    assert "tokens/seq" in header and "tokens/GPU" not in header
    answer = out.strip().splitlines()[-1]
    per_seq = int(answer.split("fits the most: ")[1].split(" tokens")[0].replace(",", ""))
    assert f"× 2 sequences = {2 * per_seq:,} per GPU" in answer
