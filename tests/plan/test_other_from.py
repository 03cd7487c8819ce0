"""``plan --other-from``: the memory beside the logprob step, read from profiled snapshots and
fitted over token counts, then planned on as ``--other`` would be."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from memprobe.attribute.what_if import other_memory
from memprobe.kernels import get_kernel
from memprobe.plan import fit_other, other_from_snapshots
from memprobe.profile import profile_step
from memprobe.snapshot.write import write_snapshot

VOCAB, HIDDEN = 2048, 64
PLAN = ["plan", "--vocab", "2048", "--chunk-size", "256", "--jobs", "1", "--no-reserved"]


def lm_step(device: torch.device, seq: int) -> None:
    """Embedding, one MLP used twice, lm_head (bf16); unchunked log-probs as the loss; AdamW."""
    kw = {"device": device, "dtype": torch.bfloat16}
    mlp = nn.Sequential(
        nn.Linear(HIDDEN, 4 * HIDDEN, **kw), nn.GELU(), nn.Linear(4 * HIDDEN, HIDDEN, **kw)
    )
    model = nn.Sequential(nn.Embedding(VOCAB, HIDDEN, **kw), mlp, mlp)
    head = nn.Linear(HIDDEN, VOCAB, bias=False, **kw)
    opt = torch.optim.AdamW([*model.parameters(), *head.parameters()])
    ids = torch.randint(0, VOCAB, (1, seq), device=device)
    (-get_kernel("unchunked")(head(model(ids)), ids).mean()).backward()
    opt.step()


@functools.cache
def snapshot(seq: int) -> dict:
    return profile_step(functools.partial(lm_step, seq=seq), "meta")


def written(tmp_path: Path, *seqs: int) -> str:
    paths = []
    for seq in seqs:
        path = tmp_path / f"step-{seq}.pickle"
        write_snapshot(snapshot(seq), path)
        paths.append(str(path))
    return ",".join(paths)


def test_the_fit_reproduces_a_third_token_count() -> None:
    readings = {seq: other_memory(snapshot(seq)) for seq in (256, 512, 1024)}
    assert all(r.tokens == seq for seq, r in readings.items())
    fit = fit_other([(r.tokens, r.other_bytes) for s, r in readings.items() if s != 512])
    assert fit.per_token_bytes > 0 and fit.constant_bytes > 0
    third = readings[512].other_bytes
    assert abs(fit.at(512) - third) <= 0.01 * third
    # The constant: the weights (embedding, lm_head, the MLP used twice; bf16) and the
    # lm_head's weight gradient, made while the logits' gradient is alive.
    weights = 2 * (2 * VOCAB * HIDDEN + 8 * HIDDEN * HIDDEN + 5 * HIDDEN)
    head_grad = 2 * VOCAB * HIDDEN
    assert weights + head_grad <= fit.constant_bytes < weights + head_grad + 1024


def test_one_snapshot_is_a_constant(tmp_path: Path) -> None:
    fit = other_from_snapshots([written(tmp_path, 512)])
    assert (
        fit.per_token_bytes == 0 and fit.constant_bytes == other_memory(snapshot(512)).other_bytes
    )


def rows(run_cli, *args: str) -> list[dict]:
    code, out, err = run_cli(*PLAN, "--kernel", "local_chunked,unchunked", "--json", *args)
    assert code == 0, err
    return json.loads(out)


def test_plan_other_from_agrees_with_plan_other(run_cli, tmp_path: Path) -> None:
    one = other_memory(snapshot(512)).other_bytes
    given = rows(run_cli, "--budget", "16MiB", "--other", str(one))
    read = rows(run_cli, "--budget", "16MiB", "--other-from", written(tmp_path, 512))
    assert [r["max_tokens"] for r in read] == [r["max_tokens"] for r in given]
    assert all(r["max_tokens"] > 0 for r in read)

    # Fitted: at its answer T the rest of the step holds other(T); planning with that
    # figure (and with other(T + 1)) as a constant brackets the same answer.
    fit = other_from_snapshots(written(tmp_path, 256, 1024).split(","))
    fitted = rows(run_cli, "--budget", "16MiB", "--other-from", written(tmp_path, 256, 1024))
    for row in fitted:
        t = row["max_tokens"]
        assert t > 0
        at = rows(
            run_cli, "--budget", "16MiB", "--other", str(fit.at(t)), "--kernel", row["kernel"]
        )
        above = rows(
            run_cli, "--budget", "16MiB", "--other", str(fit.at(t + 1)), "--kernel", row["kernel"]
        )
        assert above[0]["max_tokens"] <= t <= at[0]["max_tokens"]


def test_json_states_the_fit(run_cli, tmp_path: Path) -> None:
    """Each row carries the fit it planned on: constant, per-token bytes and residual."""
    fit = other_from_snapshots(written(tmp_path, 256, 1024).split(","))
    fitted = rows(run_cli, "--budget", "16MiB", "--other-from", written(tmp_path, 256, 1024))
    for row in fitted:
        assert row["other_per_token_bytes"] == fit.per_token_bytes > 0
        assert row["other_fit_residual_bytes"] == fit.residual_bytes >= 0
        assert row["other_bytes"] == fit.at(0)
        # The fit reproduces both readings within its residual.
        for tokens, read in fit.points:
            at = row["other_bytes"] + row["other_per_token_bytes"] * tokens
            assert abs(at - read) <= row["other_fit_residual_bytes"] + 1
    one = rows(run_cli, "--budget", "16MiB", "--other-from", written(tmp_path, 512))
    assert all(r["other_per_token_bytes"] == 0 for r in one)
    given = rows(run_cli, "--budget", "16MiB", "--other", "1MiB")
    assert all(
        r["other_per_token_bytes"] is None and r["other_fit_residual_bytes"] is None for r in given
    )


def test_text_states_the_fit(run_cli, tmp_path: Path) -> None:
    code, out, err = run_cli(
        *PLAN, "--kernel", "local_chunked", "--budget", "16MiB",
        "--other-from", written(tmp_path, 256, 1024),
    )  # fmt: skip
    assert code == 0, err
    assert "per token) = " in out.splitlines()[0]
    assert "fitted to 2 snapshots (256 tokens:" in out and "residual" in out


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda p: p.write_text("not a pickle"), "not"),
        (None, "--other and --other-from"),
    ],
)
def test_bad_input_is_one_line(run_cli, tmp_path: Path, make, says: str) -> None:
    path = tmp_path / "bad.pickle"
    if make is not None:
        make(path)
        args = ["--other-from", str(path)]
    else:
        args = ["--other-from", written(tmp_path, 256), "--other", "1MiB"]
    code, out, err = run_cli(*PLAN, "--budget", "16MiB", *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and says in err, err
