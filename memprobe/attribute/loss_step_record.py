"""Where a snapshot's loss step lies in its trace: the record both ways of finding it make,
and the check both make before trusting the step's backward."""

from __future__ import annotations

from dataclasses import dataclass

from memprobe.errors import UserError
from memprobe.snapshot.replay import Replay, ReplayBlock


def refuse_an_oom_inside(
    rep: Replay, backward_start: int, gradient: ReplayBlock, what: str
) -> None:
    """One line, exit 2, when the trace ends at an OOM before ``what``'s backward freed the
    logits' gradient: the rest of the step was never recorded."""
    oom = next((m.pos for m in rep.ooms if m.pos > backward_start), None)
    if oom is not None and (gradient.free_pos is None or gradient.free_pos > oom):
        raise UserError(
            f"the trace ends at an OOM (entry #{oom}) inside {what}'s backward: the "
            "rest of the step was never recorded, so it cannot be cut out",
            "profile the step at a size that completes (e.g. memprobe profile on meta)",
        )


@dataclass(frozen=True)
class LossStep:
    """Where a snapshot's loss step lies in its trace (positions into its entries)."""

    forward: tuple[int, int]  # first and last alloc of the step's forward
    backward: tuple[int, int]  # first and last alloc of its backward (the logits' gradient)
    logits: ReplayBlock  # the lm_head's output the step consumes
    gradient: ReplayBlock
    cut: tuple[ReplayBlock, ...]  # every block allocated in either window
    batch: int
    rows: int  # S: tokens per sequence of the lm_head's output
    vocab: int
    dtype: str  # memprobe's dtype name of the logits ("bf16")
    torch_dtype: str  # as attribution names it ("bfloat16")
    # 1 for a shifted loss (Hugging Face's logits[:, :-1] against labels[:, 1:]): the loss
    # runs on S − 1 rows per sequence, on a copy of the sliced logits made inside the cut.
    shift: int = 0
    # The step copies its shifted targets (labels[:, 1:].contiguous(), int64 [B, S − 1])
    # inside the cut: the stand-in copies them too, so they stay as recorded.
    copies_targets: bool = False
    # The user's code holds the sliced logits' copy past the step (a variable kept through
    # backward): the stand-in holds its copy too, freed where the recorded one was.
    holds_copy: bool = False

    @property
    def loss_rows(self) -> int:
        """Tokens per sequence the loss covers: S, or S − 1 for a shifted loss."""
        return self.rows - self.shift

    def inside(self, pos: int) -> bool:
        (a, b), (c, d) = self.forward, self.backward
        return a <= pos <= b or c <= pos <= d
