"""Hostile inputs, round 32 (a new user): README and --help read, then memprobe used on
one's own work as people write it: `memprobe step` at a token count that happens to equal
the hidden size, training steps written for a GPU (`.cuda()`, `torch.autocast("cuda")`,
torch.cuda's memory statistics) profiled on a laptop, and the answers checked by hand.
Each table is a defect class the pass found where a number was wrong, or a message sent
the user the wrong way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line, user_module

from memprobe.records import Event

pytest_plugins = ["pytester"]

# -- C1: `memprobe step --config llama8b --tokens 4096` (H = 4096) put 2.00 GiB of AdamW's
# foreach temporaries under "attention" (13.00 GiB of optimizer temporaries, against 15.00
# GiB at 4,097 tokens): any block whose last two sizes were [S, S] was read as attention
# scores, and an [H, H] projection's temporaries (or an [S, H] / [1, S, H] activation at
# S = H) are [S, S] too. Scores are [B, h, S, S] (a mask [B, 1, S, S]) or a bmm's
# [B·h, S, S], made in forward or backward.


def _event(shape: tuple[int, ...], phase: str, op: str = "aten.mm.default") -> Event:
    return Event(0, 0.0, "alloc", 1, 2, shape, "bfloat16", op, phase)


SCORES = {
    "eager scores [B, h, S, S]": ((1, 4, 64, 64), "forward", True),
    "a mask [B, 1, S, S]": ((1, 1, 64, 64), "forward", True),
    "a bmm's [B·h, S, S]": ((4, 64, 64), "backward", True),
    "an [H, H] optimizer temporary": ((64, 64), "optimizer", False),
    "an [S, H] activation": ((64, 64), "forward", False),
    "a [1, S, H] activation": ((1, 64, 64), "forward", False),
    "a [B, S, H] gradient temporary": ((1, 64, 64), "backward", False),
    "a 4-D block in the optimizer": ((1, 4, 64, 64), "optimizer", False),
    "a block in setup": ((1, 1, 64, 64), "setup", False),
}


@pytest.mark.parametrize("shape,phase,scores", list(SCORES.values()), ids=list(SCORES))
def test_only_score_shaped_blocks_read_as_attention(
    shape: tuple[int, ...], phase: str, scores: bool
) -> None:
    from memprobe.profile.step import _scores_shaped

    assert _scores_shaped(_event(shape, phase), 64, 1) is scores


def test_a_step_at_tokens_equal_to_hidden_counts_no_attention_at_its_optimizer_peak(
    run_cli: Any, tmp_path: Path
) -> None:
    from small_config import SMALL

    (tmp_path / "config.json").write_text(json.dumps(SMALL))
    # Checkpointing keeps the optimizer step the peak (AdamW's moments, live through
    # forward and backward from the first step on, put it in backward without).
    code, out, err = run_cli(
        "step", "--config", str(tmp_path), "--tokens", "64", "--checkpointing", "--json"
    )
    assert code == 0, err
    found = json.loads(out)
    assert found["peak_phase"] == "optimizer", found
    categories = found["bytes_by_category"]
    assert "attention" not in categories, categories
    # AdamW's foreach temporaries are the parameters' bytes again, as at any other length.
    assert categories["optimizer temporaries"] == categories["gradients"], categories


# -- C2: a training step written for the GPU (`model.cuda()`, `.to("cuda")`,
# `device="cuda:0"`, `torch.cuda.reset_peak_memory_stats()`) profiled where there is no
# CUDA said "meta tensors hold no values ... try --device cpu at a smaller size", and on
# cpu "fix the step and rerun": the same call fails on cpu too, and nothing said what was
# wrong. The line now says the step asks for CUDA itself and to build on the device it is
# given.

CUDA_CALLS = {
    ".cuda()": "torch.nn.Linear(4, 4).cuda()",
    ".to('cuda')": "torch.zeros(4).to('cuda')",
    "device='cuda:0'": "torch.zeros(4, device='cuda:0')",
    "torch.cuda's statistics": "torch.cuda.reset_peak_memory_stats()",
    "torch.cuda.synchronize()": "torch.cuda.synchronize()",
}


@pytest.mark.parametrize("device", ["meta", "cpu"])
@pytest.mark.parametrize("call", list(CUDA_CALLS.values()), ids=list(CUDA_CALLS))
def test_a_step_that_asks_for_cuda_is_told_to_use_its_device(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str, device: str
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is here: the step's own CUDA calls run")
    monkeypatch.chdir(tmp_path)
    body = (
        "import torch\n"
        "def step(device):\n"
        "    x = torch.zeros(8, device=device, requires_grad=True)\n"
        "    (x * 2).sum().backward()\n"
        f"    {call}\n"
    )
    name = user_module(tmp_path, "r32_cuda", body)
    err = one_line(*run_cli("profile", f"{name}:step", "--device", device))
    assert "asks for CUDA itself" in err and "model.to(device)" in err, err
    assert "try --device cpu" not in err, err


def test_a_step_that_fails_otherwise_keeps_the_meta_hint(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    body = "import torch\ndef step(device):\n    torch.zeros(8, device=device).item()\n"
    err = one_line(*run_cli("profile", f"{user_module(tmp_path, 'r32_item', body)}:step"))
    assert "try --device cpu" in err and "CUDA" not in err, err


# -- C3: a step under `torch.autocast("cuda", dtype=torch.bfloat16)` (how mixed precision
# is written) profiled on meta or cpu: torch turns autocast off where CUDA is not available
# (its UserWarning on stderr the only sign), so the step ran in float32 and its peak was
# shown as the step's. The reading now says, in a note, that autocast was off and the trace
# is the full-precision step; `enabled=False` (the user's own choice) is no note.

AUTOCASTS = {
    "with torch.autocast": ("with torch.autocast('cuda', dtype=torch.bfloat16):\n", 1),
    "torch.amp.autocast": ("with torch.amp.autocast(device_type='cuda'):\n", 1),
    "enabled=False": ("with torch.autocast('cuda', enabled=False):\n", 0),
    # Round 34: CPU autocast is not applied on meta either (its own note, below).
    "cpu autocast": ("with torch.autocast('cpu', dtype=torch.bfloat16):\n", 0),
}


@pytest.mark.filterwarnings("ignore:CUDA is not available")
@pytest.mark.parametrize("enter,count", list(AUTOCASTS.values()), ids=list(AUTOCASTS))
def test_cuda_autocast_turned_off_is_said(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, enter: str, count: int
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is here: autocast runs")
    monkeypatch.chdir(tmp_path)
    body = (
        "import torch\n"
        "def step(device):\n"
        "    x = torch.zeros(16, 16, device=device, requires_grad=True)\n"
        f"    {enter}"
        "        y = x @ x\n"
        "    y.sum().backward()\n"
    )
    name = user_module(tmp_path, "r32_amp", body)
    code, out, err = run_cli("profile", f"{name}:step", "--top", "1")
    assert code == 0, err
    said = f"entered torch.autocast('cuda') {count:,} time(s)"
    assert (said in out) is bool(count), out
    if not count and "cpu" not in enter:
        assert "autocast" not in out, out


# The marker too: a marked body under CUDA autocast passed its limit on meta at the
# full-precision peak. It fails, saying why; `enabled=False` passes. (Round 34: cpu
# autocast on meta fails too, it is not applied there.)
MARKED_AUTOCAST = """
import pytest
import torch

@pytest.mark.limit_peak_memory("1 MiB")
@pytest.mark.filterwarnings("ignore:CUDA is not available")
@pytest.mark.parametrize("enter", [
    lambda: torch.autocast("cuda", dtype=torch.bfloat16),
    lambda: torch.amp.autocast(device_type="cuda"),
    lambda: torch.autocast("cuda", enabled=False),
    lambda: torch.autocast("cpu", dtype=torch.bfloat16),
])
def test_body(enter):
    x = torch.zeros(16, 16, requires_grad=True)
    with enter():
        y = x @ x
    y.sum().backward()
"""


def test_the_marker_fails_a_body_whose_cuda_autocast_torch_turned_off(
    pytester: pytest.Pytester,
) -> None:
    # One pytester run: a second one in this process re-imports torch's submodules.
    from importlib.metadata import entry_points

    import torch

    from memprobe.measure.tracker import AllocationTracker

    if torch.cuda.is_available():
        pytest.skip("CUDA is here: autocast runs")
    with AllocationTracker():  # torch's lazy imports, before pytester's run drops them
        x = torch.zeros(2, 2, device="meta", requires_grad=True)
        (x @ x).sum().backward()
    installed = any(
        ep.value == "memprobe.commands.pytest_plugin" for ep in entry_points(group="pytest11")
    )
    pytester.makepyfile(test_marked=MARKED_AUTOCAST)
    args = () if installed else ("-p", "memprobe.commands.pytest_plugin")
    result = pytester.runpytest("--strict-markers", *args)
    result.assert_outcomes(passed=1, failed=3)
    result.stdout.fnmatch_lines(["*entered torch.autocast('cuda') 1 time(s)*"] * 2)
    result.stdout.fnmatch_lines(["*it was not applied on meta*"])


# -- C4: a snapshot recorded without stacks (`_record_memory_history(context=None)`, or
# one with segments and no trace) of a step with a cross-entropy loss: `attribute` said
# "no softmax / log_softmax / cross_entropy / nll_loss (or their backward) made a block in
# the trace", `--what-if` "needs a step whose loss materializes the logits" and `plan
# --other-from` the same: each a claim about the step that the file cannot make. The line
# now says no block records a stack frame and how to record one.

LM_STEP = (
    "import torch\n"
    "import torch.nn.functional as F\n"
    "def step(device):\n"
    "    emb = torch.nn.Embedding(1000, 32).to(device)\n"
    "    head = torch.nn.Linear(32, 1000, bias=False).to(device)\n"
    "    ids = torch.randint(0, 1000, (2, 16), device=device)\n"
    "    logits = head(emb(ids))\n"
    "    F.cross_entropy(logits.view(-1, 1000), ids.view(-1)).backward()\n"
)


def _as_torch_without_stacks(snapshot: Path, *, trace: bool) -> Path:
    import pickle

    snap = pickle.loads(snapshot.read_bytes())
    snap.pop("memprobe", None)
    for entries in snap["device_traces"]:
        for entry in entries:
            entry.pop("user_metadata", None)
            entry["frames"] = []
    for segment in snap["segments"]:
        segment["frames"] = []
        for block in segment["blocks"]:
            block["frames"] = []
    if not trace:
        snap["device_traces"] = [[] for _ in snap["device_traces"]]
    out = snapshot.with_name(f"bare_{trace}.pickle")
    out.write_bytes(pickle.dumps(snap, protocol=4))
    return out


@pytest.fixture(scope="module")
def stackless(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hostile import profiled

    here = tmp_path_factory.mktemp("r32_stackless")
    return profiled(here, "r32_lm_step", LM_STEP)


@pytest.mark.parametrize("trace", [True, False], ids=["context=None", "no trace"])
def test_attribute_of_a_snapshot_without_stacks_says_so(
    run_cli: Any, stackless: Path, trace: bool
) -> None:
    code, out, err = run_cli("attribute", str(_as_torch_without_stacks(stackless, trace=trace)))
    assert code == 0, err
    shapes = next(line for line in out.splitlines() if line.startswith("shapes:"))
    assert "no block records a stack frame" in shapes and "context='all'" in shapes, shapes
    assert "made a block in the trace" not in shapes, shapes


STACKLESS_COMMANDS = {
    "what-if": lambda bare: ("attribute", bare, "--what-if", "local_chunked"),
    "plan --other-from": lambda bare: (
        "plan",
        "--other-from",
        bare,
        "--vocab",
        "1000",
        "--budget",
        "1GiB",
        "--kernel",
        "local_chunked",
        "--no-reserved",
    ),
}


@pytest.mark.parametrize("args", list(STACKLESS_COMMANDS.values()), ids=list(STACKLESS_COMMANDS))
def test_a_loss_step_in_a_snapshot_without_stacks_is_not_called_absent(
    run_cli: Any, stackless: Path, args: Any
) -> None:
    bare = str(_as_torch_without_stacks(stackless, trace=True))
    err = one_line(*run_cli(*args(bare)))
    assert "no block records a stack frame" in err and "materializes" not in err, err


# diff of a snapshot with stacks against one without: every byte moved to "other" in the
# tables, with nothing said; the difference is now named first.
@pytest.mark.parametrize("order", ["with first", "without first"])
def test_diff_names_a_side_without_stacks(run_cli: Any, stackless: Path, order: str) -> None:
    bare = str(_as_torch_without_stacks(stackless, trace=True))
    a, b = (str(stackless), bare) if order == "with first" else (bare, str(stackless))
    code, out, err = run_cli("diff", a, b)
    assert code == 0, err
    said = "stack frames: recorded -> none" if order == "with first" else "none -> recorded"
    assert said in out, out


def test_diff_of_two_snapshots_with_stacks_says_nothing_of_them(
    run_cli: Any, stackless: Path
) -> None:
    code, out, err = run_cli("diff", str(stackless), str(stackless))
    assert code == 0 and "stack frames" not in out, out


def test_the_same_snapshot_with_its_stacks_finds_the_loss(run_cli: Any, stackless: Path) -> None:
    code, out, err = run_cli("attribute", str(stackless), "--what-if", "local_chunked")
    assert code == 0 and "what-if local_chunked" in out, err


# -- C5: `memprobe step --optimizer sgd` showed "optimizer state" the size of the
# parameters under a header that said "optimizer sgd": torch's SGD keeps no state unless
# it has momentum, and memprobe's has momentum 0.9, which neither the header nor --help
# said. A user of plain SGD read a buffer per parameter as SGD's own.


@pytest.mark.parametrize("optimizer,words", [("sgd", "sgd (momentum 0.9)"), ("adamw", "adamw")])
def test_the_step_header_says_how_its_optimizer_is_built(
    run_cli: Any, tmp_path: Path, optimizer: str, words: str
) -> None:
    from small_config import SMALL

    (tmp_path / "config.json").write_text(json.dumps(SMALL))
    code, out, err = run_cli(
        "step", "--config", str(tmp_path), "--tokens", "16", "--optimizer", optimizer
    )
    assert code == 0, err
    assert out.splitlines()[0].endswith(f"optimizer {words}"), out


@pytest.mark.parametrize("command", ["step", "plan"])
def test_help_says_sgd_has_momentum(run_cli: Any, command: str) -> None:
    code, out, _ = run_cli(command, "--help")
    assert code == 0 and "momentum 0.9" in " ".join(out.replace("│", " ").split()), out


# -- C6: a step or kernel named by its file alone (`memprobe profile my_step.py`, `sweep
# --kernel mine.py`), as a newcomer types a script: read as a dot for the colon, the hint
# was "e.g. my_step:py" (`did you mean 'mine:py'?`), a function named `py`. The hint now
# asks for a function, with the module spelled as it imports.

FILE_ONLY = {
    "a file": ("my_step.py", "not the file: my_step:<function>"),
    "a file in a folder": ("pkg/my_step.py", "not the file: pkg.my_step:<function>"),
    "./ a file": ("./my_step.py", "not the file: my_step:<function>"),
    "an absolute file": ("/srv/x/my_step.py", "run memprobe from /srv/x and name the module"),
}


@pytest.mark.parametrize("given,said", list(FILE_ONLY.values()), ids=list(FILE_ONLY))
def test_a_step_named_by_its_file_alone_asks_for_a_function(
    run_cli: Any, given: str, said: str
) -> None:
    err = one_line(*run_cli("profile", given))
    assert said in err and ":py" not in err, err


def test_a_kernel_named_by_its_file_alone_is_not_offered_a_function_named_py(
    run_cli: Any,
) -> None:
    err = one_line(*run_cli("sweep", "--kernel", "mine.py", "--device", "meta"))
    assert "did you mean 'mine:<function>'?" in err and "mine:py" not in err, err


@pytest.mark.parametrize(
    "given,meant",
    [
        ("my_step.train_step", "my_step:train_step"),
        ("./my_step.py:train_step", "my_step:train_step"),
    ],
)
def test_a_spelling_with_its_function_keeps_its_hint(run_cli: Any, given: str, meant: str) -> None:
    err = one_line(*run_cli("profile", given))
    assert meant in err, err


# -- C7: a sweep over several hidden sizes (`sweep --hidden 32,64 --kernel
# linear_unchunked,fused_linear_chunked`): "peak vs unchunked" matched each row to
# linear_unchunked at the same batch, tokens, vocab... but any H, so linear_unchunked at
# H = 64 read 1.08x (against its own H = 32 peak) and every H = 64 ratio was off; the
# answer quoted the lowest peak across H as the largest case's; and the gate printed the
# two cases as one line twice ("linear_unchunked b1 s64 v1024 bf16 c1024 meta"). Ratios
# are per H, the answer is at the largest H (and says it), and the gate's label has hN.


@pytest.fixture(scope="module")
def two_hidden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hostile import swept

    run = tmp_path_factory.mktemp("r32_hidden") / "run"
    return swept(
        run, "--tokens", "64", "--vocab", "1024", "--hidden", "32,64", "--no-ladder",
        "--kernel", "linear_unchunked,fused_linear_chunked", "--device", "meta", "--no-report",
    )  # fmt: skip


def test_ratios_and_the_answer_are_per_hidden_size(run_cli: Any, two_hidden: Path) -> None:
    from memprobe.report.ratios import with_ratios
    from memprobe.results import read_results

    table = with_ratios(read_results(two_hidden / "results.json"))
    for _, row in table.iterrows():
        same = table[(table["kernel"] == "linear_unchunked") & (table["hidden"] == row["hidden"])]
        assert row["saving_vs_unchunked"] == pytest.approx(
            same.iloc[0]["peak_bytes"] / row["peak_bytes"]
        ), row


def test_the_answer_is_at_the_largest_hidden_size(two_hidden: Path) -> None:
    from memprobe.render.terminal import answer_lines
    from memprobe.results import read_results, read_rows

    rows = read_rows(two_hidden / "results.json")
    lines = answer_lines(read_results(two_hidden / "results.json"), {}, budget_bytes=None)
    assert lines[0] == "At 64 tokens x 1,024 vocabulary (bf16, hidden 64):", lines
    fused = next(r for r in rows if r["kernel"] == "fused_linear_chunked" and r["hidden"] == 64)
    assert f"{fused['peak_bytes'] / 1024:,.2f} KiB" in lines[1], (lines, fused)


@pytest.mark.parametrize("hidden", [32, 64])
def test_the_gate_names_each_hidden_size(
    run_cli: Any, two_hidden: Path, tmp_path: Path, hidden: int
) -> None:
    config = tmp_path / "gate.toml"
    config.write_text(
        '[tool.memprobe.gate]\nrules = [{ kernel = "linear_unchunked", max_peak = "1 KiB" }]\n'
    )
    code, out, err = run_cli("gate", str(two_hidden), "--config", str(config))
    assert code == 1, err
    fails = [line for line in out.splitlines() if line.lstrip().startswith("FAIL")]
    assert sum(f"linear_unchunked h{hidden} b1 s64" in line for line in fails) == 1, out


# -- (round 6's input, its line improved) a small config of an architecture whose
# pad_token_id transformers fills in (phi3's 32000) past the config's vocab_size, or one
# giving pad_token_id = vocab_size: "transformers cannot build this model (Padding_idx
# must be within num_embeddings) (check the config)" named neither field. The line names
# pad_token_id, its value, vocab_size and the ids to give.

PADS = {
    "phi3's default": ({"model_type": "phi3", "num_key_value_heads": 4}, 32000),
    "llama, pad = vocab": ({"model_type": "llama", "pad_token_id": 512}, 512),
    "llama, pad far past": ({"model_type": "llama", "pad_token_id": 10**6}, 10**6),
    "llama, pad far below": ({"model_type": "llama", "pad_token_id": -1000}, -1000),
}


@pytest.mark.parametrize("extra,pad", list(PADS.values()), ids=list(PADS))
def test_a_pad_token_past_the_vocabulary_is_named(
    run_cli: Any, tmp_path: Path, extra: dict[str, Any], pad: int
) -> None:
    from small_config import SMALL

    (tmp_path / "config.json").write_text(json.dumps({**SMALL, **extra}))
    err = one_line(*run_cli("step", "--config", str(tmp_path), "--tokens", "16"))
    assert f"pad_token_id {pad:,}" in err and "vocab_size 512" in err, err
    assert "give a pad_token_id from 0 to 511" in err, err


# -- C9: the other JSON files of a model folder handed to --config: a LoRA fine-tune's
# output folder (adapter_config.json, no config.json) was "no config.json in DIR", its
# adapter_config.json, generation_config.json, tokenizer.json or tokenizer_config.json
# "has no model_type (a Hugging Face config.json names its model_type)", and an old
# config that names its architectures but no model_type the same: none said what the file
# was or what to give. Each now does.

OTHER_JSON = {
    "adapter_config.json": (
        {"peft_type": "LORA", "base_model_name_or_path": "meta-llama/Llama-3.2-1B", "r": 16},
        "PEFT adapter's config ('LORA' adapter on 'meta-llama/Llama-3.2-1B')",
    ),
    "generation_config.json": (
        {"do_sample": True, "temperature": 0.6, "eos_token_id": 2},
        "reads as a model's generation_config.json",
    ),
    "tokenizer.json": (
        {"version": "1.0", "truncation": None, "added_tokens": []},
        "reads as a model's tokenizer.json",
    ),
    "tokenizer_config.json": (
        {"tokenizer_class": "LlamaTokenizer", "model_max_length": 4096},
        "reads as a model's tokenizer_config.json",
    ),
    "config.json": (
        {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64},
        'add "model_type": "qwen2" to it',
    ),
}


@pytest.mark.parametrize("name", list(OTHER_JSON))
def test_another_json_of_a_model_folder_is_named(run_cli: Any, tmp_path: Path, name: str) -> None:
    data, said = OTHER_JSON[name]
    (tmp_path / name).write_text(json.dumps(data))
    err = one_line(*run_cli("step", "--config", str(tmp_path / name), "--tokens", "16"))
    assert said in err, err


def test_a_lora_output_folder_is_named_for_its_adapter(run_cli: Any, tmp_path: Path) -> None:
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    err = one_line(*run_cli("step", "--config", str(tmp_path), "--tokens", "16"))
    assert "PEFT adapter's config" in err and "base model's config.json" in err, err


def test_a_json_with_nothing_to_tell_keeps_the_plain_line(run_cli: Any, tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text(json.dumps({"foo": 1}))
    err = one_line(*run_cli("step", "--config", str(tmp_path / "x.json"), "--tokens", "16"))
    assert "has no model_type (a Hugging Face config.json names its model_type)" in err, err


# -- C10: a training script that reads its command line, profiled as a step: a module
# doing `EPOCHS = int(sys.argv[1]) if len(sys.argv) > 1 else 1` failed to import
# ("invalid literal for int() with base 10: 'profile'": memprobe's own argv), one with
# argparse at import ended in argparse's usage and "unrecognized arguments: profile
# my_step:train_step --top 1", where `python my_step.py` runs both with their defaults.
# User code now sees sys.argv as the program name alone (memprobe's is put back after).
# And a plain Python error of the step's own code (sys.argv[1] then, a KeyError, a
# NameError), raised by no op, was told "meta tensors hold no values ... try --device cpu";
# it is now said to be the step's own code.

ARGV_MODULES = {
    "int(sys.argv[1]) at import": (
        "import sys\nEPOCHS = int(sys.argv[1]) if len(sys.argv) > 1 else 1\n"
    ),
    "argparse at import": (
        "import argparse\np = argparse.ArgumentParser()\np.add_argument('--lr', type=float)\n"
        "args = p.parse_args()\n"
    ),
    "argparse, known args only": (
        "import argparse\np = argparse.ArgumentParser()\np.add_argument('--top', type=int)\n"
        "args, _ = p.parse_known_args()\nassert args.top is None, args\n"
    ),
}


@pytest.mark.parametrize("head", list(ARGV_MODULES.values()), ids=list(ARGV_MODULES))
def test_a_script_reading_its_command_line_gets_none(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, head: str
) -> None:
    import sys

    monkeypatch.chdir(tmp_path)
    body = head + (
        "import torch\n"
        "def step(device):\n"
        "    x = torch.zeros(8, device=device, requires_grad=True)\n"
        "    (x * 2).sum().backward()\n"
    )
    name = user_module(tmp_path, "r32_argv", body)
    code, out, err = run_cli("profile", f"{name}:step", "--top", "1")
    assert code == 0 and "peak allocated" in out, err
    assert sys.argv[1:] == ["profile", f"{name}:step", "--top", "1"], sys.argv


PYTHON_BUGS = {
    "sys.argv[1]": "    n = int(sys.argv[1])\n",
    "a KeyError": "    n = {}['n']\n",
    "a NameError": "    n = undefined_name\n",
}


@pytest.mark.parametrize("device", ["meta", "cpu"])
@pytest.mark.parametrize("bug", list(PYTHON_BUGS.values()), ids=list(PYTHON_BUGS))
def test_a_python_error_of_the_step_is_not_blamed_on_meta(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bug: str, device: str
) -> None:
    monkeypatch.chdir(tmp_path)
    body = "import sys\nimport torch\ndef step(device):\n    torch.zeros(8, device=device)\n" + bug
    name = user_module(tmp_path, "r32_bug", body)
    err = one_line(*run_cli("profile", f"{name}:step", "--device", device))
    assert "in its own Python code" in err and "try --device cpu" not in err, err


# -- C11: an option of another memprobe command (`plan --tokens 4096`, asking whether
# 4,096 tokens fit; `attribute --kernel`, `step --hidden`): click said "No such option:
# --tokens (Possible options: --kernel)", a guess of no likeness. The line says which
# commands take it (and for plan --tokens, how to check one count).

ELSEWHERE = {
    "plan --tokens": (
        ["plan", "--vocab", "1024", "--budget", "1GiB", "--tokens", "64"],
        "No such option: --tokens (plan does not take it; sweep, attribute, step do); "
        "plan answers how many tokens fit",
    ),
    "attribute --kernel": (
        ["attribute", "x.pickle", "--kernel", "local_chunked"],
        "No such option: --kernel (attribute does not take it;",
    ),
    "step --hidden": (
        ["step", "--config", "c", "--tokens", "8", "--hidden", "64"],
        "No such option: --hidden (step does not take it; sweep, plan do)",
    ),
}


@pytest.mark.parametrize("args,said", list(ELSEWHERE.values()), ids=list(ELSEWHERE))
def test_an_option_of_another_command_names_its_commands(
    run_cli: Any, args: list[str], said: str
) -> None:
    err = one_line(*run_cli(*args))
    assert said in err and "Possible options" not in err, err


def test_a_mistyped_option_keeps_clicks_guess(run_cli: Any) -> None:
    err = one_line(*run_cli("sweep", "--tokns", "5"))
    assert "No such option: --tokns (Possible options: --tokens)" in err, err


# -- C12: a list option given twice (`plan --kernel local_chunked --kernel unchunked`, as
# a user adds a second kernel; `sweep --tokens 64 --tokens=128`): click kept the last
# without a word, and the plan or sweep ran one list where two were written. The last is
# still used (the same spelling overrides a script's defaults), with a warning naming what
# was dropped and the one list to give; the same value twice, a flag twice, and a
# single-valued option given again say nothing.

TWICE = {
    "sweep --tokens, then --tokens=": (
        ["--tokens", "32", "--tokens=64"],
        "--tokens given twice: the last, '64', is used and '32' is not",
        "--tokens 32,64",
    ),
    "sweep --kernel=, then --kernel": (
        ["--kernel=local_chunked", "--kernel", "unchunked"],
        "--kernel given twice: the last, 'unchunked', is used and 'local_chunked' is not",
        "--kernel local_chunked,unchunked",
    ),
    "sweep --vocab twice": (
        ["--vocab", "512", "--vocab", "1024"],
        "--vocab given twice: the last, '1024', is used and '512' is not",
        "--vocab 512,1024",
    ),
}  # fmt: skip

SMALL_SWEEP = ["sweep", "--no-ladder", "--device", "meta", "--no-report", "--no-verify"]


@pytest.mark.parametrize("extra,said,meant", list(TWICE.values()), ids=list(TWICE))
def test_a_list_option_given_twice_is_warned_of(
    run_cli: Any, tmp_path: Path, extra: list[str], said: str, meant: str
) -> None:
    args = [*SMALL_SWEEP, "--out", str(tmp_path / "run"), *extra]
    if "--tokens" not in " ".join(extra):
        args += ["--tokens", "64"]
    if "--vocab" not in " ".join(extra):
        args += ["--vocab", "1024"]
    if "--kernel" not in " ".join(extra):
        args += ["--kernel", "unchunked"]
    code, out, err = run_cli(*args)
    assert code == 0, err
    warning = next(line for line in err.splitlines() if "given twice" in line)
    assert said in warning and f"give one list: {meant}" in warning, warning


def test_plan_warns_of_a_kernel_given_twice(run_cli: Any) -> None:
    code, out, err = run_cli(
        "plan", "--vocab", "1024", "--budget", "64MiB", "--no-reserved",
        "--kernel", "local_chunked", "--kernel", "unchunked",
    )  # fmt: skip
    assert code == 0, err
    assert "--kernel given twice: the last, 'unchunked', is used" in err, err


@pytest.mark.parametrize(
    "extra",
    [["--tokens", "64"], ["--no-ladder"], ["--device", "meta"]],
    ids=["same value", "flag", "an override"],
)
def test_a_repeat_that_drops_no_list_says_nothing(
    run_cli: Any, tmp_path: Path, extra: list[str]
) -> None:
    args = ["sweep", "--tokens", "64", "--vocab", "1024", "--no-ladder", "--kernel", "unchunked"]
    args += ["--device", "cpu", "--no-report", "--out", str(tmp_path / "run"), *extra]
    code, out, err = run_cli(*args)
    assert code == 0 and "given twice" not in err, err


# -- C13: the step and the snapshot swapped between commands: `memprobe attribute
# my_step:train_step` (the step where profile takes it) was "snapshot my_step:train_step
# does not exist (check the path)", and `memprobe profile step.pickle` "e.g. step:pickle"
# (a function named pickle). attribute and diff now say the text reads as a step and how
# to make its snapshot; a data file's name gets the plain rule, no made-up function.

STEP_AS_SNAPSHOT = {
    "attribute": ["attribute", "my_step:train_step"],
    "attribute, dotted": ["attribute", "pkg.my_step:Trainer.step"],
    "diff": ["diff", "my_step:train_step", "b.pickle"],
}


@pytest.mark.parametrize("args", list(STEP_AS_SNAPSHOT.values()), ids=list(STEP_AS_SNAPSHOT))
def test_a_step_given_as_a_snapshot_is_told_to_profile(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    err = one_line(*run_cli(*args))
    assert "reads as a step's import path" in err and "memprobe profile" in err, err


def test_a_missing_snapshot_file_still_says_check_the_path(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    err = one_line(*run_cli("attribute", "nosuch.pickle"))
    assert "does not exist" in err and "import path" not in err, err


@pytest.mark.parametrize("name", ["step.pickle", "results.json", "pyproject.toml"])
def test_a_data_file_given_as_a_step_gets_no_made_up_function(run_cli: Any, name: str) -> None:
    err = one_line(*run_cli("profile", name))
    stem, _, ext = name.rpartition(".")
    assert f"{stem}:{ext}" not in err and "pkg.module:fn" in err, err
