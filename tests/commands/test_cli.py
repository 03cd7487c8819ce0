from __future__ import annotations

import json

import pytest

from memprobe import __version__
from memprobe.kernels import KERNELS
from memprobe.kernels.peers import PEERS


def test_version_and_kernels(run_cli):
    code, out, _ = run_cli("--version")
    assert code == 0 and out.strip() == f"memprobe {__version__}"
    code, out, _ = run_cli("kernels")
    assert code == 0
    # One row per kernel, grouped under its input protocol's heading, peers last.
    expected = (
        [n for n, s in KERNELS.items() if s.inputs == "logits"]
        + [n for n, s in KERNELS.items() if s.inputs == "hidden"]
        + list(PEERS)
    )
    rows = [line.split() for line in out.splitlines()]
    listed = [words[0] for words in rows if words and words[0] in expected]
    assert listed == expected
    assert "hidden family (sweep/plan --hidden H)" in out


def test_sweep_prints_a_table_and_writes_the_run(run_cli, tmp_path):
    out = tmp_path / "run"
    code, stdout, stderr = run_cli(
        "sweep",
        "--tokens",
        "4096",
        "--vocab",
        "32768",
        "--kernel",
        "unchunked,local_chunked",
        "--device",
        "meta",
        "--out",
        str(out),
    )
    assert code == 0, stderr
    assert "peak/floor" in stdout and f"run directory: {out}" in stdout
    assert "[1/" in stderr  # progress
    assert (out / "results.json").exists()


def test_sweep_json(run_cli, tmp_path):
    code, stdout, _ = run_cli(
        "sweep",
        "--tokens",
        "2048",
        "--vocab",
        "16384",
        "--kernel",
        "local_chunked",
        "--device",
        "meta",
        "--out",
        str(tmp_path / "r"),
        "--json",
        "--no-verify",
    )
    assert code == 0
    summary = json.loads(stdout)
    assert summary["cases"] == 2 and summary["results"][0]["max_abs_err_fwd"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tokens", "0"], "must be positive"),
        (["--tokens", "-5"], "must be positive"),
        (["--tokens", "abc"], "not a whole number"),
        (["--vocab", "0"], "must be positive"),
        (["--chunk-size", "0"], "must be positive"),
        (["--kernel", "nope"], "unknown kernel"),
        (["--dtype", "int8"], "unknown dtype"),
        (["--device", "tpu"], "unknown device"),
        (["--cp", "3", "--tokens", "4096"], "does not divide"),
    ],
)
def test_bad_sweep_input_is_one_line_and_exit_2(run_cli, tmp_path, args, message):
    out = tmp_path / "run"
    code, stdout, stderr = run_cli("sweep", "--device", "meta", "--out", str(out), *args)
    assert code == 2
    assert message in stderr and len(stderr.strip().splitlines()) == 1
    assert "Traceback" not in stderr + stdout
    assert not out.exists()


def test_cuda_without_cuda(run_cli, tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, _, stderr = run_cli("sweep", "--device", "cuda", "--out", str(tmp_path / "r"))
    assert code == 2 and "CUDA is not available" in stderr


def test_out_that_cannot_be_created(run_cli, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, stderr = run_cli(
        "sweep", "--tokens", "1024", "--vocab", "16384", "--out", str(blocker / "run")
    )
    assert code == 2 and "cannot create" in stderr and blocker.read_text() == "x"


def test_resume_on_a_folder_that_is_not_a_run(run_cli, tmp_path):
    code, _, stderr = run_cli("sweep", "--resume", str(tmp_path))
    assert code == 2 and "not a memprobe run" in stderr
    assert list(tmp_path.iterdir()) == []


def test_sweep_no_report_writes_the_results_only_and_report_writes_the_page_later(
    run_cli, tmp_path
):
    out = tmp_path / "run"
    grid = ["--tokens", "512", "--vocab", "1024", "--no-ladder", "--device", "meta"]
    grid += ["--kernel", "unchunked,local_chunked"]  # a report of two draws as one of nine
    code, stdout, stderr = run_cli("sweep", *grid, "--no-report", "--out", str(out))
    assert code == 0, stderr
    assert "report:" not in stdout and f"run directory: {out}" in stdout
    assert (out / "results.json").is_file() and (out / "run.json").is_file()
    assert not list(out.glob("*.html")) and not list(out.glob("*.png"))
    code, stdout, stderr = run_cli("report", str(out))
    assert code == 0, stderr
    assert (out / "report.html").is_file() and list(out.glob("*.png"))


def test_a_resume_without_report_says_the_old_page_is_behind(run_cli, tmp_path):
    out = tmp_path / "run"
    code, _, stderr = run_cli(
        "sweep", "--tokens", "512", "--vocab", "1024", "--no-ladder", "--device", "meta",
        "--kernel", "unchunked", "--out", str(out),
    )  # fmt: skip
    assert code == 0, stderr
    code, _, stderr = run_cli("sweep", "--resume", str(out), "--no-report")
    assert code == 0, stderr
    assert (
        f"{out / 'report.html'} was written before this resume" in stderr
        and "memprobe report" in stderr
    )
