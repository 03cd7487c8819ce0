"""Hostile arguments to the kernels' Python API (round 5): ``top_p`` of every odd type,
kernel names that are not names, and logits holding NaN or +inf through the filtered
kernels. Each is a ``ValueError`` naming the argument, or the answer ``filtered`` (the
plain-autograd reference) gives; never a coerced value, a ``TypeError`` from ``float()``,
or an index error from inside a kernel."""

from __future__ import annotations

import math

import pytest
import torch

from memprobe.kernels import get_kernel, next_token_logprobs

B, S, V = 2, 5, 37


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(B, S, V, generator=gen)
    return logits, torch.randint(0, V, (B, S), generator=gen)


# Not a number in (0, 1]: a string is not parsed, a bool is not 1.0, a 0-d tensor or a
# list is not a number, and an int past float range is simply out of range.
BAD_TOP_P = ["0.5", "abc", True, False, [0.5], torch.tensor(0.5), complex(0.5, 0), 2**1100,
             0.0, -0.5, 1.0 + 1e-9, math.nan, math.inf, -math.inf]  # fmt: skip


@pytest.mark.parametrize("kernel", ["filtered", "filtered_chunked"])
@pytest.mark.parametrize("bad", BAD_TOP_P, ids=[repr(b)[:20] for b in BAD_TOP_P])
def test_top_p_takes_only_a_number_in_range(kernel: str, bad: object) -> None:
    logits, ids = _inputs()
    with pytest.raises(ValueError, match=r"top_p must be a number in \(0, 1\] or None"):
        get_kernel(kernel)(logits, ids, top_p=bad)


@pytest.mark.parametrize("bad", ["0.5", True, [0.5]])
def test_next_token_logprobs_checks_top_p_alike(bad: object) -> None:
    logits, ids = _inputs()
    with pytest.raises(ValueError, match="top_p must be a number"):
        next_token_logprobs(logits, ids, top_p=bad)


@pytest.mark.parametrize("good", [1, 1.0, 0.25, 5e-324])
def test_top_p_still_takes_numbers(good: float) -> None:
    logits, ids = _inputs()
    out = get_kernel("filtered_chunked")(logits, ids, top_p=good)
    ref = get_kernel("filtered")(logits, ids, top_p=good)
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("name", ["", None, 5, b"local_chunked"])
def test_a_kernel_that_is_not_a_name_is_refused(name: object) -> None:
    logits, ids = _inputs()
    # "" used to mean "choose for me" (a falsy test), the others raised TypeError.
    with pytest.raises(ValueError, match="kernel"):
        next_token_logprobs(logits, ids, kernel=name) if name is not None else get_kernel(name)  # type: ignore[arg-type]


# Where a row holds NaN or +inf, filtered (and local_chunked) answer NaN for that row; the
# chunked kernel used to index outside its top-p histogram, or answer a plausible -inf.
def _poisoned(where: str, dtype: torch.dtype) -> torch.Tensor:
    logits, _ = _inputs()
    if where == "one +inf":
        logits[0, 0, 3] = math.inf
    elif where == "one NaN":
        logits[0, 0, 3] = math.nan
    elif where == "all +inf":
        logits[0, 0] = math.inf
    else:  # "all -inf": every token impossible; the answer is -inf or NaN alike in both
        logits[0, 0] = -math.inf
    return logits.to(dtype)


@pytest.mark.parametrize("where", ["one +inf", "one NaN", "all +inf", "all -inf"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("filters", [{"top_p": 0.5}, {"top_p": 0.999}, {"top_k": 3, "top_p": 0.5},
                                     {"top_k": 3}])  # fmt: skip
def test_non_finite_logits_answer_as_the_reference(
    where: str, dtype: torch.dtype, filters: dict[str, float]
) -> None:
    logits = _poisoned(where, dtype)
    ids = torch.zeros(B, S, dtype=torch.long)
    ids[0, 1] = 3
    out = get_kernel("filtered_chunked")(logits, ids, **filters)
    ref = get_kernel("filtered")(logits, ids, **filters)
    assert torch.equal(out.isnan(), ref.isnan()), (out[0], ref[0])
    torch.testing.assert_close(out.nan_to_num(), ref.nan_to_num())
