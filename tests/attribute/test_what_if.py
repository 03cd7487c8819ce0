"""``attribute --what-if KERNEL``: a step profiled with one loss kernel predicts the same step
with another, held to that step's own profile (exact allocated peak, reserved within a page)."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from memprobe.attribute import attribute
from memprobe.attribute.what_if import what_if
from memprobe.errors import UserError
from memprobe.kernels import get_kernel
from memprobe.profile import profile_step
from memprobe.snapshot.write import write_snapshot

VOCAB, HIDDEN, BATCH, SEQ, CHUNK = 4096, 64, 2, 128, 32
PAGE = 2 << 20


def lm_step(
    device: torch.device,
    kernel: str = "unchunked",
    *,
    vocab: int = VOCAB,
    hidden: int = HIDDEN,
    batch: int = BATCH,
    seq: int = SEQ,
    layers: int = 1,
    steps: int = 1,
    hold: int = 1,
) -> None:
    """An embedding, MLP layers and an lm_head in bf16; the loss is ``kernel``'s log-probs."""
    kw = {"device": device, "dtype": torch.bfloat16}
    mlp = [
        nn.Sequential(
            nn.Linear(hidden, 4 * hidden, **kw), nn.GELU(), nn.Linear(4 * hidden, hidden, **kw)
        )
        for _ in range(layers)
    ]
    model = nn.Sequential(nn.Embedding(vocab, hidden, **kw), *mlp)
    head = nn.Linear(hidden, vocab, bias=False, **kw)
    opt = torch.optim.AdamW([*model.parameters(), *head.parameters()])
    for _ in range(steps):
        ids = torch.randint(0, vocab, (batch, seq), device=device)
        if hold:  # the step keeps the logits (and log-probs) in variables through backward
            logits = head(model(ids))
            logprobs = get_kernel(kernel)(logits, ids, chunk_size=CHUNK)
            loss = -logprobs.mean()
            loss.backward()
        else:  # only the loss holds them
            (-get_kernel(kernel)(head(model(ids)), ids, chunk_size=CHUNK).mean()).backward()
    opt.step()


@functools.cache
def profiled(kernel: str, **shape: int) -> dict:
    return profile_step(functools.partial(lm_step, kernel=kernel, **shape), "meta")


@pytest.mark.parametrize("kernel", ["local_chunked", "local_tiled", "unchunked"])
def test_what_if_predicts_the_other_kernels_profile(kernel: str) -> None:
    recorded = attribute(profiled(kernel))
    w = what_if(profiled("unchunked"), kernel, chunk_size=CHUNK)
    assert w.predicted_peak_bytes == recorded.peak_allocated_bytes
    assert recorded.peak_reserved_bytes is not None
    assert abs(w.predicted_reserved_peak_bytes - recorded.peak_reserved_bytes) <= PAGE
    assert w.recorded_peak_bytes == attribute(profiled("unchunked")).peak_allocated_bytes
    assert w.shape == (BATCH, SEQ, VOCAB) and w.dtype == "bfloat16"
    if kernel != "unchunked":
        # Three float32 [N, V] blocks are gone from the backward peak.
        assert w.saved_bytes > 2 * BATCH * SEQ * VOCAB * 4
        assert w.predicted.peak_phase == recorded.peak_phase


@pytest.mark.parametrize("kernel", ["local_chunked", "local_tiled", "naive_chunked"])
def test_logits_only_the_loss_holds_live_as_long_as_the_kernel_keeps_them(kernel: str) -> None:
    recorded = attribute(profiled(kernel, hold=0))
    w = what_if(profiled("unchunked", hold=0), kernel, chunk_size=CHUNK)
    assert w.predicted_peak_bytes == recorded.peak_allocated_bytes
    assert recorded.peak_reserved_bytes is not None
    assert abs(w.predicted_reserved_peak_bytes - recorded.peak_reserved_bytes) <= PAGE


def test_fits_against_a_budget() -> None:
    """It fits when the predicted reserved peak does: what the device must hold."""
    snap = profiled("unchunked")
    free = what_if(snap, "local_chunked", chunk_size=CHUNK)
    assert free.fits is None and free.capacity_bytes is None
    need = free.predicted_reserved_peak_bytes
    w = what_if(snap, "local_chunked", chunk_size=CHUNK, budget_bytes=need)
    assert w.fits is True and w.capacity_source == "--budget"
    assert what_if(snap, "local_chunked", chunk_size=CHUNK, budget_bytes=need - 1).fits is False


def test_cli_text_and_json(run_cli, tmp_path: Path) -> None:
    path = tmp_path / "step.pickle"
    write_snapshot(profiled("unchunked"), path)
    args = ("attribute", str(path), "--what-if", "local_chunked", "--chunk-size", str(CHUNK))
    code, out, err = run_cli(*args, "--budget", "1GiB")
    assert code == 0, err
    assert "what-if local_chunked: the loss step" in out
    assert "with local_chunked:" in out and ": fits 1.00 GiB (--budget)" in out
    code, out, err = run_cli(*args, "--json")
    assert code == 0, err
    w = json.loads(out)["what_if"]
    expected = attribute(profiled("local_chunked")).peak_allocated_bytes
    assert w["predicted_peak_bytes"] == expected
    assert w["saved_bytes"] == w["recorded_peak_bytes"] - expected
    assert w["shape"] == [BATCH, SEQ, VOCAB] and w["fits"] is None
    assert set(w) >= {
        "kernel", "shape", "dtype", "recorded_peak_bytes", "predicted_peak_bytes",
        "recorded_reserved_peak_bytes", "predicted_reserved_peak_bytes", "saved_bytes", "fits",
    }  # fmt: skip


def mlp_step(device: torch.device) -> None:
    """No language model: a regression MLP has no logits to replace."""
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1)).to(device)
    x = torch.empty(512, 256, device=device)
    F.mse_loss(model(x).squeeze(-1), torch.empty(512, device=device)).backward()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--what-if", "local_chunkd"), "did you mean 'local_chunked'"),
        (("--what-if", "linear_local_chunked"), "takes hidden states"),
        (("--budget", "80GiB"), "--budget applies to --what-if"),
        (("--what-if", "local_chunked", "--budget", "lots"), "--budget 'lots' is not a size"),
        # A list, as sweep and plan take: it once read as one unknown kernel's name.
        (("--what-if", "local_chunked,local_tiled"), "names several kernels"),
        (("--what-if", ",local_tiled"), "e.g. --what-if local_tiled"),
    ],
)
def test_bad_flags_are_one_line(run_cli, tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    path = tmp_path / "step.pickle"
    write_snapshot(profiled("unchunked"), path)
    code, out, err = run_cli("attribute", str(path), *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and says in err, err


def test_a_snapshot_without_a_loss_step_is_refused(run_cli, tmp_path: Path) -> None:
    path = tmp_path / "mlp.pickle"
    write_snapshot(profile_step(mlp_step, "meta"), path)
    code, out, err = run_cli("attribute", str(path), "--what-if", "local_chunked")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "no loss over [N, V] logits" in err, err


def test_several_loss_steps_are_refused() -> None:
    with pytest.raises(UserError, match="several loss steps"):
        what_if(profiled("unchunked", steps=2), "local_chunked", vocab=VOCAB)


def test_a_trace_that_ends_at_an_oom_inside_the_step_is_refused() -> None:
    """The OOM the origin story began with: the rest of backward was never recorded."""
    snap = copy.deepcopy(profiled("unchunked"))
    trace = snap["device_traces"][0]
    found = attribute(snap)
    backward = [f for f in found.logits_family if f.phase == "backward"]
    cut = min(f.alloc_index for f in backward if f.alloc_index is not None) + 1
    size = backward[0].size
    snap["device_traces"][0] = [*trace[:cut], {"action": "oom", "size": size, "stream": 0,
                                               "device_free": size // 2, "frames": []}]  # fmt: skip
    with pytest.raises(UserError, match="ends at an OOM"):
        what_if(snap, "local_chunked")


def test_a_recorded_oom_after_the_step_gives_the_capacity() -> None:
    snap = copy.deepcopy(profiled("unchunked"))
    free = 3 << 20
    snap["device_traces"][0].append(
        {"action": "oom", "size": 64 << 20, "stream": 0, "device_free": free, "frames": []}
    )
    w = what_if(snap, "local_chunked", chunk_size=CHUNK)
    assert w.capacity_source == "reserved + the device's free bytes at the OOM"
    assert w.capacity_bytes == attribute(profiled("unchunked")).reserved_at_snapshot_bytes + free
    # The failed request is outside the loss step: no kernel changes it, and it needs more
    # than the device could reach (round 25: it counts; "fits" was said of this step).
    assert w.unmet is not None and w.unmet.requested_bytes == 64 << 20
    assert w.unmet.needed_bytes > w.capacity_bytes and w.fits is False


# A sweep's own snapshots: its harness holds the logits for the whole case, so each
# snapshot, with any kernel put in its loss step, predicts that kernel's swept peak.
SWEPT = ("unchunked", "local_chunked", "local_tiled", "naive_chunked")


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hostile import swept

    return swept(
        tmp_path_factory.mktemp("whatif") / "run",
        *("--tokens", "512", "--vocab", "1024", "--chunk-size", "128", "--no-ladder"),
        *("--kernel", ",".join(SWEPT), "--device", "meta", "-q", "--no-verify", "--no-report"),
    )


# naive_chunked's blocks are a chunk's, no [N, V] step to cut (its snapshot is refused).
@pytest.mark.parametrize("recorded", SWEPT[:3])
def test_a_sweeps_snapshot_predicts_each_kernels_swept_peak(sweep_run: Path, recorded: str) -> None:
    from memprobe.snapshot.load import load_snapshot

    rows = {r["kernel"]: r for r in json.loads((sweep_run / "results.json").read_text())["rows"]}
    snap = load_snapshot(sweep_run / rows[recorded]["snapshot"])
    for kernel in SWEPT:
        w = what_if(copy.deepcopy(snap), kernel, chunk_size=128)
        assert w.predicted_peak_bytes == rows[kernel]["peak_bytes"], (recorded, kernel)


# Shape flags over a memprobe run's record (B=1, S=512): one of --batch/--tokens splits
# the recorded N; two that make another N, or one that does not divide it, are refused
# by name (they used to read as a chunked loop, then blamed the snapshot).
SHAPE_FLAGS = {
    "--batch splits N": (("--batch", "4"), "[B=4, S=128, V=1,024]"),
    "--tokens splits N": (("--tokens", "256"), "[B=2, S=256, V=1,024]"),
    "both, the same N": (("--batch", "2", "--tokens", "256"), "[B=2, S=256, V=1,024]"),
    "both, another N": (("--batch", "2", "--tokens", "512"), "= 1,024 tokens, but this"),
    "a --batch not dividing N": (("--batch", "3"), "--batch 3 does not divide the 512"),
    "a --tokens past N": (("--tokens", "1024"), "--tokens 1,024 does not divide the 512"),
}


@pytest.mark.parametrize("what", sorted(SHAPE_FLAGS))
def test_shape_flags_over_a_recorded_case(run_cli, sweep_run: Path, what: str) -> None:
    from hostile import one_line

    flags, says = SHAPE_FLAGS[what]
    rows = {r["kernel"]: r for r in json.loads((sweep_run / "results.json").read_text())["rows"]}
    snap = str(sweep_run / rows["unchunked"]["snapshot"])
    code, out, err = run_cli("attribute", snap, "--what-if", "local_chunked", *flags)
    if says.startswith("["):
        assert code == 0 and f"local_chunked at {says}" in out, (out, err)
    else:
        assert says in one_line(code, out, err) and "recorded B=1, S=512" in err, err


# A user's snapshot (no memprobe record: here a profiled step, N = 2·128 = 256 rows):
# sizes that make fewer tokens than its loss blocks have rows are refused by name.
@pytest.mark.parametrize(("tokens", "batch"), [(3, 5), (128, 1), (255, 1), (64, 2)])
def test_fewer_tokens_than_the_loss_rows(tokens: int, batch: int) -> None:
    snap = profiled("unchunked")
    with pytest.raises(UserError, match=r"\[N, V\] = \[256, 4,096\].*more than the step has"):
        attribute(snap, tokens=tokens, batch=batch)
    assert attribute(snap, tokens=SEQ, batch=BATCH).inference.tokens == BATCH * SEQ
