"""The ``limit_peak_memory`` pytest marker, run inside pytester sessions."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
import torch

from memprobe.commands.pytest_plugin import PeakLimit, parse_marker
from memprobe.errors import UserError
from memprobe.measure.tracker import AllocationTracker

pytest_plugins = ["pytester"]


@pytest.fixture(scope="module", autouse=True)
def _warm_torch() -> None:
    """Import what a tracked test body imports lazily, before any pytester run.

    An in-process pytester run drops the modules first imported during it when
    it ends; torch's submodules imported again afterwards crash the process.
    """
    with AllocationTracker():
        logits = torch.empty(2, 3, dtype=torch.bfloat16, device="meta")
        torch.empty_like(logits).float()


# Installed memprobe registers the plugin through its pytest11 entry point;
# an environment installed before that entry point existed needs -p.
_INSTALLED = any(
    ep.value == "memprobe.commands.pytest_plugin" for ep in entry_points(group="pytest11")
)
PLUGIN_ARGS = () if _INSTALLED else ("-p", "memprobe.commands.pytest_plugin")

TESTS = """
import pytest
import torch

GiB = 2**30


@pytest.mark.limit_peak_memory("10.5 GiB", device="meta")
def test_fits():
    logits = torch.empty(1, 20000, 131072, dtype=torch.bfloat16, device="meta")  # 4.88 GiB
    grad = torch.empty_like(logits)  # 4.88 GiB
    del logits, grad


@pytest.mark.limit_peak_memory("10.5 GiB")
def test_float32_copy():
    logits = torch.empty(1, 20000, 131072, dtype=torch.bfloat16, device="meta")
    upcast = logits.float()  # the 9.77 GiB block this project exists to remove
    del upcast


def test_unmarked_is_not_tracked():
    torch.empty(1, 20000, 131072, dtype=torch.float32, device="meta")
"""


def run(pytester: pytest.Pytester, source: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_marked=source)
    return pytester.runpytest("--strict-markers", *PLUGIN_ARGS, *args)


def test_marker_passes_and_fails_with_peak_limit_and_blocks(pytester: pytest.Pytester) -> None:
    result = run(pytester, TESTS)
    result.assert_outcomes(passed=2, failed=1)
    out = result.stdout.str()
    # 4.88 GiB logits + 9.77 GiB float32 copy = 14.65 GiB; 4.15 GiB over 10.5 GiB
    result.stdout.fnmatch_lines(
        [
            "*limit_peak_memory: torch tensors peaked at 14.65 GiB on meta, over the limit "
            "10.50 GiB by 4.15 GiB (+39.5%)",
            "*largest blocks live at the peak (2 of 2, 14.65 GiB of 14.65 GiB):",
            "*bytes*dtype*shape*op*made",
            "*9.77 GiB  float32 *[[]1, 20000, 131072[]]  aten._to_copy.default *"
            "at test_marked.py:17 in test_float32_copy",
            "*4.88 GiB  bfloat16 *[[]1, 20000, 131072[]]  aten.empty.memory_format *"
            "at test_marked.py:16 in test_float32_copy",
        ]
    )
    assert "test_fits" not in out.split("short test summary")[-1]


def test_marker_is_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers", *PLUGIN_ARGS)
    result.stdout.fnmatch_lines(["@pytest.mark.limit_peak_memory(limit, device='meta'): *"])


@pytest.mark.parametrize(
    ("marker", "expected"),
    [
        ('"ten GiB"', "limit_peak_memory: limit 'ten GiB' is not a size"),
        ('"1 GiB", device="tpu"', "limit_peak_memory: unknown device 'tpu'"),
        ('device="meta"', "limit_peak_memory: no limit given"),
    ],
)
def test_bad_marker_arguments_error_the_test(
    pytester: pytest.Pytester, marker: str, expected: str
) -> None:
    source = f"import pytest\n\n@pytest.mark.limit_peak_memory({marker})\ndef test_x():\n    pass\n"
    result = run(pytester, source)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*{expected}*"])


def test_cuda_without_cuda_errors_loudly(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU build
    source = (
        "import pytest\n\n"
        '@pytest.mark.limit_peak_memory("1 GiB", device="cuda")\n'
        "def test_x():\n    pass\n"
    )
    result = run(pytester, source)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*device='cuda' but CUDA is not available here*"])


def test_an_exception_in_the_body_is_reported_as_is(pytester: pytest.Pytester) -> None:
    source = (
        "import pytest\n\n"
        '@pytest.mark.limit_peak_memory("1 GiB")\n'
        "def test_x():\n    raise ValueError('boom')\n"
    )
    result = run(pytester, source)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*ValueError: boom*"])


def test_parse_marker() -> None:
    assert parse_marker(("10.5 GiB",), {}) == PeakLimit(int(10.5 * 2**30), "meta")
    assert parse_marker((), {"limit": 100, "device": "cpu"}) == PeakLimit(100, "cpu")
    assert parse_marker(("1 KiB", "cuda"), {}) == PeakLimit(1024, "cuda")
    for args, kwargs in [((1, "cpu", 3), {}), ((1,), {"limit": 2}), ((1,), {"lim": 2})]:
        with pytest.raises(UserError):
            parse_marker(args, kwargs)


README_EXAMPLE = """
import pytest
import torch

from memprobe.kernels import get_kernel


def step(kernel):
    # No device= anywhere: under the meta marker these are meta tensors.
    logits = torch.randn(1, 20000, 131072, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 131072, (1, 20000))
    out = get_kernel(kernel)(logits, targets)
    torch.autograd.grad(out, logits, torch.ones_like(out))


@pytest.mark.limit_peak_memory("10.5 GiB", device="meta")
def test_logprob_step_fits():
    step("local_chunked")


@pytest.mark.limit_peak_memory("10.5 GiB", device="meta")
def test_unchunked_does_not():
    step("unchunked")
"""


def test_readme_example_at_full_scale_simulates(pytester: pytest.Pytester) -> None:
    """20,000 x 131,072 tensors made without a device: meta, not 34 GiB of real memory."""
    result = run(pytester, README_EXAMPLE)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*limit_peak_memory: torch tensors peaked at 34.18 GiB on meta, over the limit*"]
    )


# Helper modules the marked tests call into; the float32 copy is made inside them.
HELPERS = {
    "mod": "def upcast(x):\n    y = x * 1\n    return y.float()\n",
    "inner": "def cast(x):\n    return x.float()\n",
    "outer": "from inner import cast\n\n\ndef step(x):\n    return cast(x)\n",
}
BLAME = """
import pytest
import torch
from memprobe.kernels import get_kernel
from mod import upcast
from outer import step


def helper(x):
    return x.float()


def run(call):
    logits = torch.empty(1, 20000, 131072, dtype=torch.bfloat16)
    return call(logits)


@pytest.mark.limit_peak_memory("5 GiB")
def test_module():
    upcast(torch.empty(1, 20000, 131072, dtype=torch.bfloat16))


@pytest.mark.limit_peak_memory("5 GiB")
def test_two_levels():
    step(torch.empty(1, 20000, 131072, dtype=torch.bfloat16))


@pytest.mark.limit_peak_memory("5 GiB")
def test_helper_here():
    run(helper)


@pytest.mark.limit_peak_memory("5 GiB")
def test_memprobe_kernel():
    logits = torch.empty(1, 20000, 131072, dtype=torch.bfloat16)
    get_kernel("unchunked")(logits, torch.zeros(1, 20000, dtype=torch.long))
"""


def _line(text: str) -> int:
    """The line of BLAME (as written to test_marked.py) that holds ``text``."""
    lines = BLAME.strip("\n").splitlines()
    return next(i for i, line in enumerate(lines, start=1) if text in line)


# Each test: the line the failure names for its float32 block (the innermost user or
# kernel frame), then the test's own line.
BLAMED = {
    "test_module": f"at mod.py:3 in upcast (called from test_marked.py:{_line('upcast(torch')} "
    "in test_module)",
    "test_two_levels": f"at inner.py:2 in cast (called from test_marked.py:{_line('step(torch')}",
    "test_helper_here": f"at test_marked.py:{_line('return x.float()')} in helper (called from "
    f"test_marked.py:{_line('run(helper)')} in test_helper_here)",
    "test_memprobe_kernel": "in unchunked_logprobs (called from "
    f"test_marked.py:{_line('get_kernel(')} in test_memprobe_kernel)",
}


def test_the_block_is_blamed_on_the_line_that_made_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(**HELPERS)
    result = run(pytester, BLAME, "-p", "no:cacheprovider")
    result.assert_outcomes(failed=len(BLAMED))
    out = result.stdout.str()
    for test, expected in BLAMED.items():
        section = out.split(f" {test} ")[1].split("\n_")[0]
        line = next(x for x in section.splitlines() if "9.77 GiB  float32" in x)
        assert expected in line, (test, line)
