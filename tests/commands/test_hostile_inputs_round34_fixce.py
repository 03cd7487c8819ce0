"""Round 34, two wrong-number classes fixed: a step with as many tokens as vocabulary
entries (N = V, a square [N, N] logits block), and CPU autocast ignored on meta."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from memprobe.attribute import attribute
from memprobe.attribute.categories import LOGITS
from memprobe.profile import profile_step

sys.path.insert(0, str(Path(__file__).parents[1] / "attribute"))
import corpus  # noqa: E402  (tests/attribute's CUDA-like programs: no labels)

# -- C: N = V ---------------------------------------------------------------------------------


def readme_step(device: torch.device, *, vocab: int, batch: int, seq: int, hidden: int) -> None:
    """The README's my_step.py at other sizes (bf16 model, loss on a float copy, AdamW)."""
    model = nn.Sequential(
        nn.Embedding(vocab, hidden), nn.Linear(hidden, 4 * hidden), nn.GELU(),
        nn.Linear(4 * hidden, hidden), nn.Linear(hidden, vocab, bias=False),
    ).to(device=device, dtype=torch.bfloat16)  # fmt: skip
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, vocab, (batch, seq), device=device)
    logits = model(ids)
    F.cross_entropy(logits.float().view(-1, vocab), ids.view(-1)).backward()
    opt.step()


def retrieval_step(device: torch.device, *, n: int, hidden: int, head: bool) -> None:
    """A dual encoder with in-batch negatives: q @ d.T is [n, n], cross_entropy over it."""
    emb = nn.Embedding(30522, hidden).to(device)
    proj = nn.Linear(hidden, hidden).to(device)
    opt = torch.optim.AdamW([*emb.parameters(), *proj.parameters()])
    q = emb(torch.randint(0, 30522, (n, 8), device=device)).mean(1)
    d = emb(torch.randint(0, 30522, (n, 8), device=device)).mean(1)
    if head:
        q, d = proj(q), proj(d)
    sim = F.normalize(q, dim=-1) @ F.normalize(d, dim=-1).T / 0.05
    F.cross_entropy(sim, torch.arange(n, device=device)).backward()
    opt.step()


@functools.cache
def _profiled(step: Any, **kw: Any) -> dict[str, Any]:
    return profile_step(functools.partial(step, **kw), "meta")


@pytest.mark.parametrize(
    ("vocab", "batch", "seq", "hidden"),
    [
        (1024, 1, 1024, 64),  # N = V, one sequence (the report's 32k·32k, small)
        (2048, 2, 1024, 128),  # N = B·S = V
        (4096, 1, 4096, 64),
        (1024, 1, 512, 64),  # N = V/2: the plain case stays as it was
    ],
)
def test_logits_as_square_as_the_step_read_from_the_label(
    vocab: int, batch: int, seq: int, hidden: int
) -> None:
    snap = _profiled(readme_step, vocab=vocab, batch=batch, seq=seq, hidden=hidden)
    found = attribute(snap, top=20)
    inf = found.inference
    assert inf.logits_path, inf.evidence
    assert (inf.tokens, inf.vocab) == (batch * seq, vocab), (inf.evidence, inf.alternatives)
    # The float32 [N, V] log_softmax and the loss's backward blocks are the logits' family.
    n_v_f32 = batch * seq * vocab * 4
    family = [f for f in found.findings if f.category == LOGITS and f.size == n_v_f32]
    assert len(family) >= 2, [(f.category, f.size) for f in found.findings[:8]]


@pytest.mark.parametrize(
    ("n", "hidden", "head"),
    [(512, 64, False), (1024, 64, True), (2048, 64, False), (2048, 128, True)],
)
def test_a_labelled_similarity_matrix_is_not_logits(n: int, hidden: int, head: bool) -> None:
    """memprobe's label records [n, n]: no [V, H] parameter nor token ids make it logits,
    and no other split of its bytes ([N=128, V=65,536] before) stands against the label."""
    inf = attribute(_profiled(retrieval_step, n=n, hidden=hidden, head=head), top=5).inference
    assert not inf.logits_path, (inf.tokens, inf.vocab, inf.evidence)


def _corpus_lm(vocab: int, batch: int, seq: int) -> corpus.Program:
    def run(t: Any) -> Any:
        t.set_phase("setup")
        model = corpus.Gpt(vocab, 256, 4, 2)
        t.set_phase("forward")
        corpus.gpt_step(model, batch, seq, vocab)
        return model

    return corpus.Program("square", "N = V", run, corpus.Truth(batch, seq, vocab, 256))


@pytest.mark.parametrize(("vocab", "batch", "seq"), [(2048, 8, 256), (1024, 1, 1024)])
def test_unlabelled_square_logits_keep_their_n_and_v(vocab: int, batch: int, seq: int) -> None:
    """A CUDA-like snapshot (no labels): [N=8,192, V=1,024] (low) and V = 2,048 (high!)
    were read before; a [V, H] parameter made before the forward tells V from N's
    [N, H] activations."""
    inf = attribute(_corpus_lm(vocab, batch, seq).snapshot(), top=5).inference
    assert inf.logits_path
    assert (inf.tokens, inf.vocab, inf.hidden) == (batch * seq, vocab, 256), inf.evidence


# -- E: CPU autocast on meta ------------------------------------------------------------------
# Meta tensors take no autocast: a step under torch.autocast("cpu", dtype=torch.bfloat16)
# profiled on meta ran in float32 (1 MiB above cpu at 256 tokens x 2,048) with no word.
# Now it gets a note, as CUDA autocast torch turns off does; the marker fails (round 32's
# pytester test covers the marker).


def _mm(device: torch.device) -> torch.Tensor:
    x = torch.zeros(16, 16, device=device, requires_grad=True)
    return x @ x


def _one(device: torch.device) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = _mm(device)
    y.float().sum().backward()


def _amp(device: torch.device) -> None:
    with torch.amp.autocast(device_type="cpu"):
        y = _mm(device)
    y.float().sum().backward()


def _twice(device: torch.device) -> None:
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = _mm(device)
        y.float().sum().backward()


@torch.autocast("cpu", dtype=torch.bfloat16)
def _decorated(device: torch.device) -> None:
    _mm(device).float().sum().backward()


def _off(device: torch.device) -> None:
    with torch.autocast("cpu", enabled=False):
        y = _mm(device)
    y.sum().backward()


def _none(device: torch.device) -> None:
    _mm(device).sum().backward()


@pytest.mark.parametrize(
    ("step", "device", "count"),
    [
        (_one, "meta", 1),
        (_amp, "meta", 1),
        (_twice, "meta", 2),
        (_decorated, "meta", 1),
        (_off, "meta", 0),  # the user's own enabled=False: nothing to say
        (_none, "meta", 0),
        (_one, "cpu", 0),  # applied on cpu: the trace is the autocast step
        (_decorated, "cpu", 0),
    ],
)
def test_autocast_not_applied_on_meta_is_said(step: Any, device: str, count: int) -> None:
    snap = profile_step(step, device)
    assert snap["memprobe"].get("autocast_not_applied", 0) == count
    notes = [n for n in attribute(snap, top=1).notes if "autocast" in n]
    if count:
        assert len(notes) == 1, notes
        assert f"torch.autocast {count:,} time(s)" in notes[0]
        assert "not applied on meta" in notes[0] and "--device cpu" in notes[0]
    else:
        assert not notes, notes
