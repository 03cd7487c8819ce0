"""``--what-if`` on a snapshot made with one of memprobe's own chunked kernels: no float32
``[N, V]`` blocks show the loss step, so it is found by the kernel's frames (its custom
autograd Function), and "what would the naive loss have cost?" is answered, to the byte."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import pytest
import torch
from test_what_if import BATCH, CHUNK, PAGE, SEQ, VOCAB, lm_step

from memprobe.attribute import attribute
from memprobe.attribute.own_kernel_step import kernel_file
from memprobe.attribute.what_if import what_if
from memprobe.errors import UserError
from memprobe.kernels import get_kernel
from memprobe.profile import profile_step
from memprobe.snapshot.write import write_snapshot


@functools.cache
def profiled(kernel: str, **shape: int) -> dict:
    return profile_step(functools.partial(lm_step, kernel=kernel, **shape), "meta")


@pytest.mark.parametrize("hold", [1, 0])
@pytest.mark.parametrize(
    ("recorded", "kernel"),
    [
        ("local_chunked", "unchunked"),
        ("local_chunked", "naive_chunked"),
        ("local_tiled", "unchunked"),
        ("local_tiled", "local_chunked"),
        ("local_chunked", "local_chunked"),
    ],
)
def test_a_chunked_kernels_snapshot_predicts_the_other_kernels_profile(
    recorded: str, kernel: str, hold: int
) -> None:
    truth = attribute(profiled(kernel, hold=hold))
    w = what_if(profiled(recorded, hold=hold), kernel, chunk_size=CHUNK)
    assert w.predicted_peak_bytes == truth.peak_allocated_bytes
    assert truth.peak_reserved_bytes is not None
    assert abs(w.predicted_reserved_peak_bytes - truth.peak_reserved_bytes) <= PAGE
    assert w.shape == (BATCH, SEQ, VOCAB) and w.dtype == "bfloat16" and not w.shifted
    assert w.recorded_peak_bytes == attribute(profiled(recorded, hold=hold)).peak_allocated_bytes
    if kernel == "unchunked":
        # The naive loss's float32 [N, V] blocks come back.
        assert -w.saved_bytes > BATCH * SEQ * VOCAB * 4


def test_the_step_is_found_by_the_kernels_frames() -> None:
    snap = profiled("local_chunked")
    made = {kernel_file(e) for e in snap["device_traces"][0] if e["action"] == "alloc"}
    assert "local_chunked" in made
    w = what_if(snap, "unchunked", chunk_size=CHUNK)
    (fs, fe), (bs, be) = w.forward_entries, w.backward_entries
    trace = snap["device_traces"][0]
    assert kernel_file(trace[fs]) == kernel_file(trace[be]) == "local_chunked"
    assert fs <= fe < bs <= be


def test_a_kernel_that_writes_its_gradient_into_the_logits_is_refused() -> None:
    with pytest.raises(UserError, match="writes the gradient into the logits' buffer"):
        what_if(profiled("local_chunked_inplace"), "unchunked")


def test_two_steps_of_a_chunked_kernel_are_refused() -> None:
    with pytest.raises(UserError, match="several loss steps"):
        what_if(profiled("local_chunked", steps=2), "unchunked")


def test_without_labels_or_a_readable_shape_it_asks_for_one() -> None:
    """A GPU recording has frames but no memprobe labels: the shape must come from somewhere."""
    snap = copy.deepcopy(profiled("local_chunked"))
    for trace in snap["device_traces"]:
        for e in trace:
            e.pop("user_metadata", None)
    with pytest.raises(UserError, match="the logits' shape is not"):
        what_if(snap, "unchunked")
    w = what_if(snap, "unchunked", chunk_size=CHUNK, vocab=VOCAB, tokens=SEQ, batch=BATCH)
    assert w.predicted_peak_bytes == attribute(profiled("unchunked")).peak_allocated_bytes


def test_cli_reads_a_chunked_step(run_cli, tmp_path: Path) -> None:
    path = tmp_path / "chunked.pickle"
    write_snapshot(profiled("local_chunked"), path)
    code, out, err = run_cli("attribute", str(path), "--what-if", "unchunked")
    assert code == 0, err
    assert "what-if unchunked: the loss step" in out and "costs" in out


def test_kernel_file_reads_posix_and_windows_paths() -> None:
    windows = {"frames": [{"filename": "C:\\x\\memprobe\\kernels\\local_tiled.py"}]}
    assert kernel_file(windows) == "local_tiled"
    assert kernel_file({"frames": [{"filename": "/x/my_kernels/local_tiled.py"}]}) is None
    assert kernel_file({"frames": []}) is None


def fused_step(device: torch.device) -> None:
    """memprobe's fused lm_head + logprob kernel: no logits at all."""
    embed = torch.nn.Embedding(VOCAB, 64, device=device)
    weight = torch.nn.Parameter(torch.empty(VOCAB, 64, device=device))
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), device=device)
    loss = get_kernel("fused_linear_chunked")(embed(ids), weight, ids, chunk_size=CHUNK)
    loss.sum().backward()


def test_a_fused_kernels_step_is_refused_as_such() -> None:
    with pytest.raises(UserError, match="takes the hidden states"):
        what_if(profile_step(fused_step, "meta"), "unchunked")
