"""Hostile inputs, round 26 (r26_files), files a user hands memprobe and the flag values
that go with them: results whose numbers are each in range but draw nothing a plot can
hold, snapshots whose frames name files with characters shown as escapes or whose
memprobe record holds numbers no run writes, memprobe's own step snapshots read back by
`--what-if` and `plan --other-from`, model config.json files of quantized checkpoints or
nested past any model, and numbers written in another script's digits. Each table is a
variant of a defect class the pass found: one line and exit 2 that names what is wrong,
or an answer whose every word the file supports."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line, user_module
from small_config import SMALL


def _errors_set(made_run: Path, to: Path, errors: list[float]) -> Path:
    """A copy of ``made_run`` whose rows carry these forward errors, one per row (the last
    repeated), as a sweep with the float64 check writes them."""
    run = Path(shutil.copytree(made_run, to))
    payload = json.loads((run / "results.json").read_text())
    for i, row in enumerate(payload["rows"]):
        row["max_abs_err_fwd"] = errors[min(i, len(errors) - 1)]
    (run / "results.json").write_text(json.dumps(payload))
    return run


# -- N1: a numerics error of 1e18 or more (a results file takes them up to 1e100), or a
# subnormal one: the numerics plot's log axis limits were int powers of ten (10**19 is
# past int64: numpy's isfinite refused it) or the log of half a subnormal (0: math domain
# error), so `report` and the report at the end of a sweep ended in a traceback and wrote
# no page. A user kernel that returns finite nonsense (log-probs x 1e30) did it too.

ERRORS = {
    "1e18": [1e18],
    "1e99, the largest a results file takes": [9.9e99],
    "subnormal 5e-324": [5e-324],
    "1e-310 (subnormal)": [1e-310],
    "the two ends in one run": [5e-324, 9.9e99],
    "an ordinary error": [3e-3],
}


@pytest.mark.parametrize("what", sorted(ERRORS))
def test_numerics_of_any_size_a_results_file_takes_draw(what: str) -> None:
    import pandas as pd

    from memprobe.render.plots import numerics

    errors = ERRORS[what]
    kernels = [f"k{i}" for i in range(len(errors))]
    frame = pd.DataFrame(
        {"kernel": kernels, "dtype": "bf16", "max_abs_err_fwd": errors, "max_abs_err_bwd": errors}
    )
    png = numerics(frame, kernels)
    assert png is not None and png.startswith(b"\x89PNG")


def test_a_report_of_the_largest_and_smallest_errors_is_written(
    run_cli: Any, made_run: Path, tmp_path: Path
) -> None:
    """The same, as `report` reads them from a run's results.json."""
    run = _errors_set(made_run, tmp_path / "run", ERRORS["the two ends in one run"])
    code, out, err = run_cli("report", str(run), "--out", str(tmp_path / "page.html"))
    assert code == 0 and "Traceback" not in err, (out, err)
    assert (tmp_path / "page-numerics.png").read_bytes().startswith(b"\x89PNG")


def test_a_kernel_whose_values_are_finite_nonsense_still_gets_its_page(
    run_cli: Any, here: Path
) -> None:
    name = user_module(
        here,
        "huge",
        "from memprobe.kernels import get_kernel\n"
        "def k(logits, targets, *, chunk_size=None):\n"
        "    return get_kernel('unchunked')(logits, targets) * 1e30\n",
    )
    args = ["sweep", "--tokens", "16", "--vocab", "32", "--no-ladder", "--device", "meta"]
    code, out, err = run_cli(*args, "--kernel", f"{name}:k", "-q", "--out", str(here / "r"))
    assert code == 0 and "Traceback" not in err, (out, err)
    assert (here / "r" / "report.html").is_file()
    row = json.loads((here / "r" / "results.json").read_text())["rows"][0]
    assert row["max_abs_err_fwd"] > 1e18, row


# -- F1: a frame whose file name holds a character printed as its escape (a bidi override,
# a control): the escape's backslash was taken for a Windows path separator, so the line
# named a file that is not there ('/x/\u202eevil.py' read 'u202eevil.py:24 in ...', the
# folder's 'a\x1bb' read 'x1bb/...'). The name is split from its folders before escaping.

FILE_NAMES = {
    "a bidi override": ("/x/\u202eevil.py", "\\u202eevil.py:"),
    "an escape code": ("/x/a\x1b[2Jb.py", "a\\x1b[2Jb.py:"),
    "a tab in a windows path": ("C:\\jobs\\tr\tain.py", "tr\\tain.py:"),
    "a control in a folder's name": ("/x/d\x1bir/train.py", " train.py:"),
    "a plain windows path": ("C:\\Users\\me\\new\\train.py", " train.py:"),
    "a plain posix path": ("/home/me/rl/train.py", " train.py:"),
}


def _frames_in(path: str) -> Any:
    import snapshot_fixtures as fx

    def moved(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**f, "filename": path} if f["filename"] == fx.KERNEL else f for f in frames]

    return fx._map_frames(fx.unchunked_snapshot(), moved)


@pytest.mark.parametrize("what", sorted(FILE_NAMES))
@pytest.mark.parametrize("html", [False, True])
def test_a_frames_file_is_named_by_its_own_name(
    run_cli: Any, tmp_path: Path, what: str, html: bool
) -> None:
    path, shown = FILE_NAMES[what]
    snap = tmp_path / "s.pickle"
    snap.write_bytes(pickle.dumps(_frames_in(path), protocol=4))
    page = tmp_path / "p.html"
    code, out, err = run_cli("attribute", str(snap), "--top", "2", *(["--html", str(page)] * html))
    assert code == 0, err
    text = page.read_text() if html else out
    assert shown in text, text
    assert "u202eevil" not in text.replace("\\u202eevil", ""), text
    assert "\x1b" not in text and "\u202e" not in text


# -- Q1: a quantized checkpoint's config.json (it gives a quantization_config: GPTQ, AWQ,
# bitsandbytes, fp8): `step` and `plan --step` built the unquantized model of its sizes,
# every weight in --dtype and trained, and printed that peak as this model's, several
# times what its 4- or 8-bit frozen weights hold, without a word. It is one line now.

QUANTIZED = {
    "bitsandbytes 4-bit": {"quant_method": "bitsandbytes", "load_in_4bit": True},
    "gptq": {"quant_method": "gptq", "bits": 4, "group_size": 128},
    "fp8": {"quant_method": "fp8", "activation_scheme": "dynamic"},
    "a method that is not text": {"quant_method": 5},
    "an empty table": {},
}


def _config(where: Path, **extra: Any) -> str:
    where.mkdir(exist_ok=True)
    (where / "config.json").write_text(json.dumps({**SMALL, **extra}))
    return str(where)


def _step_args(command: str, config: str) -> list[str]:
    return {
        "step": ["step", "--config", config, "--tokens", "16"],
        "plan --step": ["plan", "--step", "--config", config, "--budget", "1GiB"],
    }[command]


@pytest.mark.parametrize("what", sorted(QUANTIZED))
@pytest.mark.parametrize("command", ["step", "plan --step"])
def test_a_quantized_checkpoints_config_is_one_line(
    run_cli: Any, tmp_path: Path, what: str, command: str
) -> None:
    config = _config(tmp_path / "c", quantization_config=QUANTIZED[what])
    err = one_line(*run_cli(*_step_args(command, config)))
    assert "is a quantized checkpoint's" in err and "drop quantization_config" in err, err
    method = QUANTIZED[what].get("quant_method")
    assert (f"quant_method '{method}'" in err) == isinstance(method, str), err


def test_a_config_without_quantization_is_stepped(run_cli: Any, tmp_path: Path) -> None:
    code, out, err = run_cli(*_step_args("step", _config(tmp_path / "c", quantization_config=None)))
    assert code == 0 and out.startswith("llama"), err


# -- W1: `attribute --what-if` on a step memprobe profiled with one of its chunked kernels
# (`step --out`, `profile --out`): the logits' gradient was the largest block made in the
# kernel's backward whose size matched a block live before the step. At S <= chunk the
# float32 chunk of a bf16 step is twice the logits, as large as an embedding [V, H = 2S]:
# the chunk was taken for the gradient, the prediction ran at float32 logits, and
# `--what-if local_chunked` on a local_chunked step predicted 605.24 KiB for its recorded
# 590.87 KiB. memprobe's labels (dtype, elements) now tell the gradient from the chunk.

ROUND_TRIPS = {
    "local_chunked bf16, S = H/2 (the chunk as large as the embedding)": (
        "local_chunked",
        "bf16",
        32,
    ),
    "local_tiled bf16, S = H/2": ("local_tiled", "bf16", 32),
    "local_chunked fp16, S = H/2": ("local_chunked", "fp16", 32),
    "local_chunked bf16, no block of the chunk's size": ("local_chunked", "bf16", 16),
}


@pytest.mark.parametrize("what", sorted(ROUND_TRIPS))
def test_what_if_its_own_kernel_on_a_step_predicts_the_recorded_peak(
    run_cli: Any, tmp_path: Path, what: str
) -> None:
    kernel, dtype, tokens = ROUND_TRIPS[what]
    snap = tmp_path / "step.pickle"
    args = ["step", "--config", _config(tmp_path / "c"), "--tokens", str(tokens)]
    args += ["--kernel", kernel, "--dtype", dtype, "--optimizer", "none", "--out", str(snap)]
    code, _, err = run_cli(*args)
    assert code == 0, err
    code, out, err = run_cli("attribute", str(snap), "--top", "1", "--what-if", kernel)
    assert code == 0, err
    torch_dtype = {"bf16": "bfloat16", "fp16": "float16"}[dtype]
    assert f"at [B=1, S={tokens}, V=512] {torch_dtype}" in out, out
    assert "(saves 0 B)" in out, out


# The same reading fed `plan --other-from`: the 32-token step's "other" read 413.00 KiB
# (its chunk cut as the gradient) against 512.87 KiB, off the line the 48- and 64-token
# steps draw, and the plan's per-token cost of the rest of the step doubled.


def test_other_from_steps_of_its_own_kernel_lie_on_one_line(run_cli: Any, tmp_path: Path) -> None:
    config = _config(tmp_path / "c")
    snaps = []
    for tokens in (32, 48, 64):
        snaps.append(str(tmp_path / f"s{tokens}.pickle"))
        args = ["step", "--config", config, "--tokens", str(tokens), "--optimizer", "none"]
        code, _, err = run_cli(*args, "--out", snaps[-1])
        assert code == 0, err
    args = ["plan", "--vocab", "512", "--budget", "4MiB", "--kernel", "local_chunked"]
    code, out, err = run_cli(*args, "--no-reserved", "--other-from", ",".join(snaps))
    assert code == 0, err
    assert "32 tokens: 512.87 KiB" in out and "residual 0 B" in out, out


# -- D1: a count, list or percentage written in another script's digits. Python's int()
# and float() read every script's decimal digits, so `--tokens ৪0` (the Bengali four,
# which reads as an 8) ran 40 tokens, `--max-regression ৪` gated at 4%, `--vocab ١٢٨`
# planned V = 128, while a size (`--budget ৪0GiB`) and typer's counts (`--top ৩`) were
# refused. Every number is written in 0-9 now, and the digit that is not is named.

FOREIGN_DIGITS = {
    "sweep --tokens, a Bengali four": (
        ["sweep", "--tokens", "৪0", "--vocab", "128", "--device", "meta", "--no-ladder"],
        "'৪' (U+09EA BENGALI DIGIT FOUR)",
    ),
    "plan --vocab, Arabic-Indic digits": (
        ["plan", "--vocab", "١٢٨", "--budget", "1MiB", "--no-reserved"],
        "'١' (U+0661 ARABIC-INDIC DIGIT ONE)",
    ),
    "plan --chunk-size, fullwidth digits": (
        ["plan", "--vocab", "128", "--budget", "1MiB", "--chunk-size", "256,１０２４"],
        "'１' (U+FF11 FULLWIDTH DIGIT ONE)",
    ),
    "sweep --tp, a Devanagari two": (
        ["sweep", "--tokens", "64", "--vocab", "128", "--device", "meta", "--tp", "1,२"],
        "'२' (U+0968 DEVANAGARI DIGIT TWO)",
    ),
    "plan --batch, a Thai digit": (
        ["plan", "--vocab", "128", "--budget", "1MiB", "--batch", "๒"],
        "'๒' (U+0E52 THAI DIGIT TWO)",
    ),
}


@pytest.mark.parametrize("what", sorted(FOREIGN_DIGITS))
def test_a_count_in_another_scripts_digits_is_one_line(
    run_cli: Any, tmp_path: Path, what: str
) -> None:
    args, named = FOREIGN_DIGITS[what]
    err = one_line(*run_cli(*args))
    assert named in err and "not the digits 0-9" in err, err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("value", ["৪", "٥%", "５"])
def test_a_max_regression_in_another_scripts_digits_is_one_line(
    run_cli: Any, made_run: Path, tmp_path: Path, value: str
) -> None:
    base = shutil.copytree(made_run, tmp_path / "base")
    (tmp_path / "g.toml").write_text(
        '[tool.memprobe.gate]\nrules = [{kernel = "*", max_peak = "1GiB"}]\n'
    )
    args = ["gate", str(made_run), "--config", str(tmp_path / "g.toml"), "--baseline", str(base)]
    err = one_line(*run_cli(*args, "--max-regression", value))
    assert f"--max-regression {value!r} is written with" in err and "not 0-9" in err, err


@pytest.mark.parametrize("value", ["٦٠٠", "６00"])
def test_a_case_timeout_in_another_scripts_digits_is_refused_as_typed(
    run_cli: Any, value: str
) -> None:
    args = ["sweep", "--shard", "--case-timeout", value, "--tokens", "64", "--vocab", "128"]
    err = one_line(*run_cli(*args, "--device", "meta"))
    assert f"--case-timeout {value!r} is not a number of seconds" in err, err


@pytest.mark.parametrize("value", ["64", "6_4", " 64 "])
def test_a_count_in_0_to_9_is_still_read(run_cli: Any, tmp_path: Path, value: str) -> None:
    args = ["plan", "--vocab", "128", "--budget", "1MiB", "--kernel", "unchunked", "--json"]
    code, out, err = run_cli(*args, "--no-reserved", "--batch", value)
    assert code == 0 and json.loads(out)[0]["max_tokens"] > 0, err


# The allocator settings' numbers too: `--alloc-conf max_split_size_mb:٢٠٠` was modelled
# as 200 MB, a setting torch's own parser (0-9 only) refuses.


@pytest.mark.parametrize(
    "conf",
    [
        "max_split_size_mb:٢٠٠",
        "garbage_collection_threshold:٠.٥",
        "roundup_power2_divisions:[256:٤,>:2]",
        "max_non_split_rounding_mb:５12",
    ],
)
def test_allocator_settings_in_another_scripts_digits_are_one_line(run_cli: Any, conf: str) -> None:
    args = ["plan", "--vocab", "128", "--budget", "1MiB", "--kernel", "unchunked"]
    err = one_line(*run_cli(*args, "--alloc-conf", conf))
    assert "is written with" in err and "not the digits 0-9" in err, err


# -- C2: the case id of memprobe's record in a snapshot (`memprobe.case`) read with \d+:
# a number of 5,000 digits in it (an edited file) ended `attribute` and `--what-if` in
# int()'s ValueError past Python's 4,300 digits, a traceback, and another script's digits
# (`-s٦٤-`) were read as the record's shape. Its numbers are 0-9, a count memprobe runs.

CASE_IDS = {
    "tokens of 5,000 digits": "local_chunked-b1-s" + "9" * 5000 + "-v128-bf16-c1024-tp1-cp1-meta-x",
    "tp of 5,000 digits": "local_chunked-b1-s64-v128-bf16-c1024-tp" + "9" * 5000 + "-cp1-meta-x",
    "hidden of 5,000 digits": "k-h" + "7" * 5000 + "-b1-s64-v128-bf16-c1024-tp1-cp1-meta-x",
    "tokens past 2^40": "local_chunked-b1-s99999999999999-v128-bf16-c1024-tp1-cp1-meta-x",
    "Arabic-Indic tokens": "local_chunked-b1-s٦٤-v128-bf16-c1024-tp1-cp1-meta-x",
}


@pytest.mark.parametrize("what", sorted(CASE_IDS))
@pytest.mark.parametrize("what_if", [False, True])
def test_a_recorded_case_id_no_run_writes_is_no_record(
    run_cli: Any, made_run: Path, tmp_path: Path, what: str, what_if: bool
) -> None:
    source = next((made_run / "snapshots").iterdir())
    snap = pickle.loads(source.read_bytes())
    snap["memprobe"]["case"] = CASE_IDS[what]
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    extra = ["--what-if", "local_chunked"] if what_if else []
    code, out, err = run_cli("attribute", str(path), "--top", "1", *extra)
    assert "Traceback" not in err and code in (0, 2), (code, err)


def test_the_recorded_case_id_a_run_writes_is_still_read(run_cli: Any, made_run: Path) -> None:
    snap = next((made_run / "snapshots").iterdir())
    code, out, err = run_cli("attribute", str(snap), "--top", "1")
    assert code == 0 and "[B=1, S=64, V=128]" in out and "confidence given" in out, err


# -- H1: a config.json nested a few hundred levels deep: JSON parsed it (its own limit is
# near 1,000), then transformers copied the config recursively while the step was traced
# and `step` said "the step failed on meta in its setup phase (RecursionError ...)",
# with a hint to raise the recursion limit the *step* lowers. It is refused as it is read.


def _nested(levels: int, kind: str) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"a": value} if kind == "dict" else [value]
    return value


NESTED = {
    "rope_scaling 500 objects deep": ("rope_scaling", 500, "dict"),
    "an extra key 500 lists deep": ("extra", 500, "list"),
    "an extra key 100 objects deep": ("extra", 100, "dict"),
}


@pytest.mark.parametrize("what", sorted(NESTED))
@pytest.mark.parametrize("command", ["step", "plan --step"])
def test_a_config_nested_past_any_model_is_one_line(
    run_cli: Any, tmp_path: Path, what: str, command: str
) -> None:
    key, levels, kind = NESTED[what]
    config = _config(tmp_path / "c", **{key: _nested(levels, kind)})
    err = one_line(*run_cli(*_step_args(command, config)))
    assert "nests deeper than 64 levels" in err and "RecursionError" not in err, err


def test_a_config_nested_as_deep_as_a_real_one_is_stepped(run_cli: Any, tmp_path: Path) -> None:
    config = _config(tmp_path / "c", quantization_note=_nested(8, "dict"))
    code, out, err = run_cli(*_step_args("step", config))
    assert code == 0 and out.startswith("llama"), err
