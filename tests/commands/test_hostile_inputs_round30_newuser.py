"""Hostile inputs, round 30 (a new user): the README read top to bottom and every command
in it run as written, then the planning problems a newcomer brings (tokens on an 80 GiB GPU
at a 131k vocabulary, profiling one's own step, a what-if on it, a gated kernel of one's
own with a baseline, a Hugging Face config's whole step). Each table is a defect class the
pass found where a message did not tell the newcomer what was wrong or what to do, or
where two outputs read the same file differently."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line

# -- N2: `memprobe step --config meta-llama/Llama-3.2-1B` (a Hub model id, what a
# newcomer types) said "--config meta-llama/Llama-3.2-1B does not exist (check the path)":
# the user checks a path they never meant. memprobe downloads nothing; the line now says
# the text reads as a Hub id and where that model's config.json comes from. A mistyped
# path (its folder exists, or it names a .json) keeps "check the path".

HUB_IDS = {
    "llama": ("step", "meta-llama/Llama-3.2-1B"),
    "qwen, dotted": ("step", "Qwen/Qwen2.5-7B"),
    "plan --step": ("plan", "mistralai/Mistral-7B-v0.1"),
}


@pytest.mark.parametrize("command,model", list(HUB_IDS.values()), ids=list(HUB_IDS))
def test_a_hub_model_id_says_memprobe_downloads_nothing(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, model: str
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["--tokens", "64"] if command == "step" else ["--step", "--budget", "1GiB"]
    err = one_line(*run_cli(command, "--config", model, *args))
    assert "Hub model id" in err and "downloads nothing" in err, err
    assert f"https://huggingface.co/{model}/blob/main/config.json" in err, err


MISTYPED_PATHS = {
    "folder exists": lambda here: (here / "tiny").mkdir() or "tiny/nosuch",
    "a json file": lambda here: "models/config.json",
    "one name": lambda here: "nosuchdir",
}


@pytest.mark.parametrize("make", list(MISTYPED_PATHS.values()), ids=list(MISTYPED_PATHS))
def test_a_mistyped_path_still_says_check_the_path(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    err = one_line(*run_cli("step", "--config", make(tmp_path), "--tokens", "64"))
    assert "does not exist" in err and "Hub" not in err, err


def test_a_real_config_under_an_owner_like_folder_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from small_config import SMALL

    from memprobe.profile.hf_config import read_config_json

    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "model").mkdir(parents=True)
    (tmp_path / "org" / "model" / "config.json").write_text(json.dumps(SMALL))
    (tmp_path / "org" / "model.json").write_text(json.dumps(SMALL))
    assert read_config_json(Path("org/model/config.json")) == SMALL
    assert read_config_json(Path("org/model.json")) == SMALL


# -- N1: README's own `my_step` (an embedding, one MLP, an lm_head, AdamW) with its loss
# swapped for memprobe's local_chunked, profiled and read by `memprobe attribute`, said
# "no LM logits path found: ... and no forward matmul made [N, V] from a [V, H] weight"
# beside the lm_head's very [4096, 32000] output, with --vocab/--tokens/--batch given too
# ("not applied without a logits path"), while --what-if on the same file found the step
# at [B=1, S=4,096, V=32,000]. One MLP makes too few [N, H] activations to argue H. With
# all three given the forward matmul of that [N, V] is now read as the lm_head's (--vocab
# alone is not enough: float32 [N/2, V] is bfloat16 [N, V]'s bytes); without them the line
# says why no matmul was read and to pass them.

ONE_LAYER_STEP = """
import torch
from torch import nn
from memprobe.kernels import get_kernel

def step(device):
    vocab, hidden, tokens = {vocab}, 64, {tokens}
    model = nn.Sequential(
        nn.Embedding(vocab, hidden), nn.Linear(hidden, 4 * hidden), nn.GELU(),
        nn.Linear(4 * hidden, hidden), nn.Linear(hidden, vocab, bias=False),
    ).to(device=device, dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, vocab, (1, tokens), device=device)
    logits = model(ids)
    loss = -get_kernel("{kernel}")(logits, ids).mean()
    loss.backward()
    opt.step()
"""

ONE_LAYER = {
    "local_chunked, 32000 x 1024": ("local_chunked", 32000, 1024),
    "local_tiled, 8192 x 2048": ("local_tiled", 8192, 2048),
    "local_chunked, 50257 x 512": ("local_chunked", 50257, 512),
}


@pytest.fixture(scope="module")
def one_layer_snapshots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from hostile import profiled

    here = tmp_path_factory.mktemp("one_layer")
    return {
        name: profiled(
            here,
            f"one_layer_{i}",
            ONE_LAYER_STEP.format(kernel=kernel, vocab=vocab, tokens=tokens),
        )
        for i, (name, (kernel, vocab, tokens)) in enumerate(ONE_LAYER.items())
    }


@pytest.mark.parametrize("name", list(ONE_LAYER))
def test_a_one_layer_step_with_memprobes_kernel_reads_its_lm_head_given_vocab(
    run_cli: Any, one_layer_snapshots: dict[str, Path], name: str
) -> None:
    _, vocab, tokens = ONE_LAYER[name]
    snapshot = str(one_layer_snapshots[name])
    code, out, err = run_cli("attribute", snapshot, "--json")
    assert code == 0, err
    found = json.loads(out)
    if found["vocab"] is None:  # not read without --vocab: the line says why, truthfully
        code, text, err = run_cli("attribute", snapshot, "--top", "1")
        assert "no forward matmul made [N, V]" not in text and "pass --vocab, --tokens" in text
    given = ("--vocab", str(vocab), "--tokens", str(tokens), "--batch", "1")
    code, out, err = run_cli("attribute", snapshot, "--json", *given)
    assert code == 0, err
    found = json.loads(out)
    reading = found["inference"]
    assert (found["vocab"], reading["tokens"]) == (vocab, tokens), reading
    code, out, err = run_cli("attribute", snapshot, "--top", "1", *given)
    family = out.split("logits-family blocks:")[1]
    assert "no LM logits path" not in family and "forward  op aten.mm" in family, out


def test_a_wrong_vocab_still_finds_no_lm_head(
    run_cli: Any, one_layer_snapshots: dict[str, Path]
) -> None:
    snapshot = str(one_layer_snapshots["local_chunked, 32000 x 1024"])
    given = ("--vocab", "31999", "--tokens", "1024", "--batch", "1")
    code, out, err = run_cli("attribute", snapshot, "--top", "1", *given)
    assert code == 0 and "no LM logits path found" in out, (err, out)


# -- N3: `memprobe profile my_step:train_step` without --out began its reading
# "snapshot: my_step:train_step", where `attribute` (and profile with --out) names the file
# it read or wrote: nothing was written, and a newcomer looked for that file. Without
# --out the first line now names the step and says no snapshot was written; with --out it
# names the file, and --json keeps its "path" as before.

PROFILE_OUTPUTS = {
    "no --out": ([], "step: {mod}:step (no snapshot written: --out FILE keeps one)"),
    "--out": (["--out", "{here}/s.pickle"], "snapshot: {here}/s.pickle"),
    "--html only": (["--html", "{here}/p.html"], "step: {mod}:step (no snapshot written"),
}


@pytest.mark.parametrize("flags,first", list(PROFILE_OUTPUTS.values()), ids=list(PROFILE_OUTPUTS))
def test_profile_names_a_snapshot_only_when_it_wrote_one(
    run_cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], first: str
) -> None:
    from hostile import TINY_STEP, user_module

    monkeypatch.chdir(tmp_path)
    mod = user_module(tmp_path, "tiny_step", TINY_STEP)
    args = [f.format(here=tmp_path) for f in flags]
    code, out, err = run_cli("profile", f"{mod}:step", "--top", "1", *args)
    assert code == 0, err
    assert out.splitlines()[0].startswith(first.format(mod=mod, here=tmp_path)), out
    code, out, err = run_cli("profile", f"{mod}:step", "--json")
    assert code == 0 and json.loads(out)["path"] == f"{mod}:step", err


# -- N4: `plan --kernel local_chunked --batch 2 --cp 4` answered "25,599 tokens per sequence
# × 2 sequences = 51,198 per GPU (cp 4, 102,396 global, ...)": beside a per-GPU total,
# "102,396 global" read as the job's total tokens, which is 4 x 51,198 = 204,792; it is
# one sequence's length across the cp group. With --batch above 1 the answer now says so;
# at batch 1 (tokens per GPU and the global sequence are the same kind) it is unchanged.

CP_ANSWERS = {
    "batch 2, cp 4": (["--batch", "2", "--cp", "4"], "cp 4: each sequence {g:,} tokens across"),
    "batch 3, cp 2": (["--batch", "3", "--cp", "2"], "cp 2: each sequence {g:,} tokens across"),
    "batch 1, cp 4": (["--cp", "4"], "cp 4, {g:,} global"),
}


@pytest.mark.parametrize("flags,said", list(CP_ANSWERS.values()), ids=list(CP_ANSWERS))
def test_plan_answer_names_the_global_sequence_beside_a_batch(
    run_cli: Any, flags: list[str], said: str
) -> None:
    base = ["plan", "--vocab", "128", "--budget", "64MiB", "--kernel", "local_chunked"]
    code, out, err = run_cli(*base, "--no-reserved", *flags)
    assert code == 0, err
    code, js, err = run_cli(*base, "--no-reserved", "--json", *flags)
    row = json.loads(js)[0]
    assert row["global_tokens"] == row["max_tokens"] * row["cp"], row
    answer = out.strip().splitlines()[-1]
    assert said.format(g=row["global_tokens"]) in answer, answer
