"""filtered_select's top-p selection alone: its pieces against exact references."""

from __future__ import annotations

import pytest
import torch

import memprobe.kernels.filtered_select as fs
from memprobe.kernels import filtered_chunked_logprobs, filtered_logprobs
from memprobe.kernels.filtered import filtered_out_mask, mass_bits, top_p_limit
from memprobe.kernels.local_chunked import _row_max
from memprobe.measure import step
from memprobe.measure.meta_backend import simulate_tracker
from memprobe.measure.step import StepInputs
from memprobe.measure.traced import traced_step
from memprobe.records import Case


def _rows(dtype: torch.dtype, vocab: int) -> torch.Tensor:
    """Rows that stress the selection, ``[1, n, V]`` float32 of ``dtype``'s values:
    normal draws at three scales, integer logits (runs of ties, top-p stopping
    inside one), one value everywhere (a bucket over the list's length), a -inf
    tail, a single finite logit, and a row of -inf."""
    gen = torch.Generator().manual_seed(21)
    rows = [torch.randn(4, vocab, generator=gen) * scale for scale in (0.01, 1.0, 3.0, 30.0)]
    rows.append(torch.randint(-3, 3, (4, vocab), generator=gen).float())
    rows.append(torch.full((1, vocab), 0.5))
    tail = torch.randn(2, vocab, generator=gen)
    tail[:, vocab // 3 :] = float("-inf")
    single = torch.full((1, vocab), float("-inf"))
    single[0, 7] = 2.0
    rows += [tail, single, torch.full((1, vocab), float("-inf"))]
    return torch.cat(rows).to(dtype).float().unsqueeze(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 0.999])
@pytest.mark.parametrize("block", [3, 64])
def test_top_p_selection_equals_a_stable_sort_of_each_row(dtype, top_p, block):
    # In blocks of 3 rows (not dividing the rows) or all at once, batch 2: tau,
    # logsum and cut exactly as a stable sort of the whole row gives them.
    x = _rows(dtype, 1031)
    x = torch.cat([x, x.flip(1)])  # batch 2, the second in another order
    m = _row_max(x)
    bufs = fs.TopPBuffers(2, block, x.shape[-1], x.device)
    tau, logsum, cut = fs.select_top_p(x, m, top_p, bufs)
    for b in range(x.shape[0]):
        for s in range(x.shape[1]):
            ref = fs._sorted_select(x[b : b + 1, s : s + 1], m[b : b + 1, s : s + 1], top_p)
            got = (tau[b, s], logsum[b, s], cut[b, s])
            for name, value, want in zip(("tau", "logsum", "cut"), got, ref, strict=True):
                assert torch.equal(value, want[0, 0]), (name, b, s, value, want)


def test_the_histogram_settles_normal_rows_without_sorting_them(monkeypatch):
    # Only the rows whose bucket overflows the list (one value everywhere) and the one
    # with no mass (all -inf) are sorted; not the tiny scale's, whose few buckets
    # hold hundreds of logits each at this vocabulary.
    sorted_rows = []
    real = fs._sorted_select
    monkeypatch.setattr(fs, "_sorted_select", lambda *a: sorted_rows.append(1) or real(*a))
    x = _rows(torch.bfloat16, 2048)[:, 4:]
    fs.select_top_p(x, _row_max(x), 0.9, fs.TopPBuffers(1, 8, 2048, x.device))
    assert len(sorted_rows) == 2


def test_hit_bucket_by_exact_integers():
    # The highest bucket whose mass at or above it reaches ceil(p * total), and the
    # mass above it, in Python integers; masses near 2^62 that float64 would round.
    gen = torch.Generator().manual_seed(4)
    per_binade, groups = 8, 5
    bins = torch.randint(0, 2**58, (2, 6, groups * per_binade), generator=gen)
    bins[0, 0] = 0
    bins[0, 0, 13] = 5  # one bucket holds all the mass
    bins[0, 1, :-1] = 0  # all of it in the top bucket
    bins[1, 2, per_binade:] = 0  # all of it in the first group
    bins[1, 3] = torch.where(torch.rand(bins.shape[-1], generator=gen) < 0.8, 0, bins[1, 3])
    for top_p in (0.05, 0.5, 0.9, 1 - 2**-40):
        hit, above, limit = fs._hit_bucket(bins.clone(), per_binade, top_p)
        for b in range(2):
            for s in range(6):
                masses = bins[b, s].tolist()
                want_limit = int(top_p_limit(torch.tensor(sum(masses)), top_p))
                bucket = max(k for k in range(len(masses)) if sum(masses[k:]) >= want_limit)
                assert int(limit[b, s]) == want_limit
                assert int(hit[b, s]) == bucket
                assert int(above[b, s]) == sum(masses[bucket + 1 :])


@pytest.mark.parametrize("cap", [4, 512])
def test_members_on_host_and_on_device_agree(cap):
    # numpy's gathering (cpu) and torch's (other devices), on cpu tensors: the first
    # cap members of each row in vocabulary order, -inf and V after, and the counts.
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(2, 5, 300, generator=gen)
    members = torch.rand(x.shape, generator=gen) < 0.02
    members[1, 3] = True  # 300 members, over any cap here
    members[0, 2] = False
    lists = []
    for gather in (fs._members_on_host, fs._members_on_device):
        cand = torch.full((2, 5, cap), float("-inf"))
        cand_idx = torch.full((2, 5, cap), 300)
        use_numpy = gather is fs._members_on_host
        args = (members.numpy(), x.numpy()) if use_numpy else (members, x)
        count = torch.as_tensor(gather(*args, cand, cand_idx))
        lists.append((cand, cand_idx, count))
    (cand, idx, count), (cand_d, idx_d, count_d) = lists
    assert torch.equal(cand, cand_d) and torch.equal(idx, idx_d) and torch.equal(count, count_d)
    assert torch.equal(count, members.sum(-1))
    for b in range(2):
        for s in range(5):
            where = members[b, s].nonzero().squeeze(-1)[:cap]
            assert torch.equal(idx[b, s, : len(where)], where)
            assert torch.equal(cand[b, s, : len(where)], x[b, s, where])
            assert (idx[b, s, len(where) :] == 300).all()


def test_one_thread_inside_restored_after_even_on_error():
    threads = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="inside"):
        with fs.one_thread(torch.device("cpu")):
            assert torch.get_num_threads() == 1
            raise RuntimeError("inside")
    assert torch.get_num_threads() == threads


def test_select_rows_lists_at_least_a_row():
    assert fs.select_rows(1024, 32768) == fs.SELECT_ROWS
    assert fs.select_rows(1024, 131072) * fs.BUCKET_CAP >= 131072
    assert fs.select_rows(5, 131072) == 5
    assert fs.select_rows(1024, 100) == fs.SELECT_ROWS
    assert mass_bits(32768) == 47


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("chunk", [64, 16])
def test_meta_peak_equals_a_real_run_whose_rows_are_all_sorted(monkeypatch, dtype, chunk):
    # Two values over 2,500 logits: every row's bucket overflows the list, so every
    # row is sorted alone (which meta, without values, skips): within the peak.
    monkeypatch.setitem(step.SWEEP_FILTERS, "filtered_chunked", {"top_p": 0.9})
    shape = (1, 150, 2500)
    case = Case("filtered_chunked", *shape, dtype, chunk, device="cpu")
    gen = torch.Generator().manual_seed(2)
    logits = torch.randint(0, 2, shape, generator=gen).to(step.torch_dtype(dtype))
    inputs = StepInputs(
        logits.requires_grad_(),
        torch.randint(0, shape[2], shape[:2], generator=gen),
        torch.randn(shape[:2], generator=gen),
    )
    cpu = traced_step(case, inputs, capture_frames=False).tracker
    meta = simulate_tracker(Case("filtered_chunked", *shape, dtype, chunk, device="meta"))
    assert meta.peak_bytes == cpu.peak_bytes
    assert dict(meta.phase_peaks) == dict(cpu.phase_peaks)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("chunk", [None, 10])
def test_top_p_alone_in_blocks_not_dividing_the_sequence(monkeypatch, dtype, chunk):
    # Blocks of 7 rows over 3 x 47 positions (and chunks of 10 asked for): the same
    # kept set as filtered, its log-probs, and a gradient on the kept logits only;
    # one position of NaN and one of +inf answer NaN, as filtered's do.
    monkeypatch.setattr(fs, "SELECT_ROWS", 7)
    gen = torch.Generator().manual_seed(13)
    logits = (torch.randn(3, 47, 509, generator=gen) * 2).to(dtype)
    logits[1, 5:9] = torch.randint(-2, 2, (4, 509), generator=gen).to(dtype)  # ties
    logits[2, 40, 3], logits[2, 41, 8] = float("nan"), float("inf")
    targets = torch.randint(0, 509, (3, 47), generator=gen)
    targets[:, ::3] = logits.float().argmax(-1)[:, ::3]
    x = logits.clone().requires_grad_()
    out = filtered_chunked_logprobs(x, targets, chunk_size=chunk, top_p=0.8)
    (grad,) = torch.autograd.grad(out.nan_to_num(0.0, 0.0, 0.0).sum(), x)
    ref = filtered_logprobs(logits, targets, top_p=0.8)
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isinf(), ref.isinf())
    assert out.isnan()[2, 40:42].all() and not out.isnan()[:2].any()
    finite = out.isfinite()
    assert (out[finite] - ref[finite]).abs().max().item() <= 1e-5
    drop = filtered_out_mask(logits.float(), top_k=None, top_p=0.8)
    assert not grad[:2][drop[:2]].any() and grad[:2][~drop[:2]].ne(0).any()
