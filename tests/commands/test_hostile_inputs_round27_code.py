"""Hostile inputs, round 27 (user code memprobe imports and runs: a user's kernel and its
backward, a user's step, a test body under the pytest marker and the marker's own
arguments): each row is a variant of a defect class the pass found. One line and exit 2,
the case's error row, or a sane answer. The classes, in order: a kernel writing into the
inputs it is given without saying so; several limits on one test; a str subclass read
through its own ``__str__``; a user's torch.library op answered from memprobe's memory of
meta ops; an output replacing a module the user's code imported; a result (or gradient)
whose Tensor subclass lies about itself in plain properties; meta tensors counted as a
device='cpu' test's memory; the marker's verdict given through a pytest.fail the test
body replaced; a resume adding rows of a user kernel edited since the run began; os._exit
and os.chdir in a thread user code started, as memprobe went on."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from hostile import one_line, user_module
from launch import forked_pytest, forked_torchrun

pytest_plugins = ["pytester"]

SWEEP = ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--device", "meta",
         "--no-verify", "--no-report", "--json"]  # fmt: skip
# A kernel module: the kernel ``{fn}``'s result, then ``{after}`` (run under no_grad).
KERNEL = (
    "import torch\nfrom memprobe.kernels import get_kernel\n"
    "def k(logits, targets, *, chunk_size=None):\n"
    "    out = get_kernel({fn!r})(logits, targets, chunk_size=chunk_size)\n"
    "    with torch.no_grad():\n        {after}\n"
    "    return out\n"
    "k.memprobe_consumes_logits = {consumes}\n"
)
HIDDEN = (
    "import torch\nfrom memprobe.kernels import get_kernel\n"
    "def k(hidden, weight, targets, *, chunk_size=None):\n"
    "    out = get_kernel('linear_unchunked')(hidden, weight, targets)\n"
    "    with torch.no_grad():\n        {after}\n"
    "    return out\n"
)


# -- a kernel writing into the inputs memprobe gives it without saying so
# (memprobe_consumes_logits): one that wrote its gradient into the logits in backward (as
# local_chunked_inplace does), or zeroed them after its forward, was measured as a kernel
# that keeps its logits. Its floor counted a gradient it never holds, and the answer named
# it the lowest peak with no word that it consumes them, or "Keeping the logits intact:"
# beside local_chunked_inplace; `plan` recommended it with no such note either.
WRITES = {
    "gradient into the logits in backward": ("local_chunked_inplace", "pass"),
    "tiled gradient into the logits": ("local_tiled_inplace", "pass"),
    "zeroes the logits after forward": ("unchunked", "logits.zero_()"),
    "copies into the logits": ("local_chunked", "logits.copy_(logits * 2)"),
    "a view of the logits": ("unchunked", "logits[0, :1].fill_(0)"),
}


@pytest.mark.parametrize("what", WRITES)
def test_a_kernel_writing_into_its_logits_unsaid_is_its_row(
    run_cli: Any, here: Path, what: str
) -> None:
    fn, after = WRITES[what]
    body = KERNEL.format(fn=fn, after=after, consumes=False)
    kernel = user_module(here, "r27_writes", body) + ":k"
    code, out, err = run_cli(*SWEEP, "--kernel", f"{kernel},local_chunked")
    assert code == 0, err
    rows = json.loads(out)["results"]
    assert [r["status"] for r in rows] == ["error", "ok"]
    assert "wrote into its logits" in rows[0]["note"]
    assert "memprobe_consumes_logits" in rows[0]["note"]


@pytest.mark.parametrize("fn", ["local_chunked_inplace", "local_tiled_inplace", "unchunked"])
def test_a_kernel_that_says_it_consumes_its_logits_is_measured(
    run_cli: Any, here: Path, fn: str
) -> None:
    kernel = user_module(here, "r27_says", KERNEL.format(fn=fn, after="pass", consumes=True))
    code, out, err = run_cli(*SWEEP, "--kernel", f"{kernel}:k,{fn}")
    assert code == 0, err
    rows = json.loads(out)["results"]
    assert [r["status"] for r in rows] == ["ok", "ok"]
    # Its floor is the logits alone (no gradient of their own), as the built-in's.
    assert rows[0]["floor_bytes"] == 64 * 128 * 2


@pytest.mark.parametrize(
    "after", ["weight.mul_(0.5)", "hidden.zero_()", "hidden.add_(1); weight.add_(1)"]
)
def test_a_hidden_kernel_writing_into_its_inputs_is_its_row(
    run_cli: Any, here: Path, after: str
) -> None:
    kernel = user_module(here, "r27_hidden_writes", HIDDEN.format(after=after)) + ":k"
    code, out, err = run_cli(*SWEEP, "--hidden", "32", "--kernel", f"{kernel},linear_unchunked")
    assert code == 0, err
    rows = json.loads(out)["results"]
    assert [r["status"] for r in rows] == ["error", "ok"]
    assert "the kernel wrote into its" in rows[0]["note"]


def test_plan_refuses_a_kernel_writing_into_its_logits_unsaid(run_cli: Any, here: Path) -> None:
    body = KERNEL.format(fn="local_chunked_inplace", after="pass", consumes=False)
    kernel = user_module(here, "r27_plan_writes", body) + ":k"
    err = one_line(*run_cli("plan", "--vocab", "128", "--budget", "1MiB", "--no-reserved",
                            "--kernel", kernel))  # fmt: skip
    assert "wrote into its logits" in err


# -- several limits on one test: pytest's nearest marker is the decorator just above the
# def, and memprobe applied that one alone. A "1 KiB" decorator above a "1 GiB" one was
# ignored and a 1 MiB body passed; a device='cpu' limit beside a meta one was never
# measured; a pytest.param's own limit gave way to the function's decorator. A class's or
# a module's marker is still one the test's own overrides.
LIM = "@pytest.mark.limit_peak_memory"
STACKED = {
    "strict_above_loose": f"{LIM}('1 KiB')\n{LIM}('1 GiB')\ndef test_{{}}():\n",
    "loose_above_strict": f"{LIM}('1 GiB')\n{LIM}('1 KiB')\ndef test_{{}}():\n",
    "one_per_device": f"{LIM}('1 KiB', device='cpu')\n{LIM}('1 KiB')\ndef test_{{}}():\n",
    "the_same_twice": f"{LIM}('1 GiB')\n{LIM}('1 GiB')\ndef test_{{}}():\n",
    "params_and_functions": (
        "@pytest.mark.parametrize('n', [pytest.param(1, marks=pytest.mark.limit_peak_memory"
        f"('1 KiB'))])\n{LIM}('1 GiB')\ndef test_{{}}(n):\n"
    ),
}
BODY = "    torch.empty(1 << 20, dtype=torch.uint8)\n"


def _tests(table: dict[str, str], head: str = "") -> str:
    """One test file: ``head``, then a test per row (its name the row's)."""
    return "import pytest, torch\n" + head + "".join(t.format(n) + BODY for n, t in table.items())


def test_several_limits_on_one_test_are_refused(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_stacked=_tests(STACKED))
    result = forked_pytest(pytester, "-p", "no:cacheprovider", "-rE")
    result.assert_outcomes(errors=len(STACKED))
    text = result.stdout.str()
    assert text.count("2 markers on this one test") == len(STACKED) and "Traceback" not in text


OVERRIDES = {
    "function_over_module": f"{LIM}('4 MiB')\ndef test_{{}}():\n",
    "method_over_class": f"{LIM}('1 KiB')\nclass Test{{}}:\n    {LIM}('4 MiB')\n"
    "    def test_it(self):\n    ",
    "a_params_own_alone": "@pytest.mark.parametrize('n', [pytest.param(1, marks=pytest.mark"
    ".limit_peak_memory('4 MiB'))])\ndef test_{}(n):\n",
}


def test_a_limit_overriding_an_outer_one_still_applies(pytester: pytest.Pytester) -> None:
    head = f"pytestmark = {LIM[1:]}('1 KiB')\n"
    pytester.makepyfile(test_override=_tests(OVERRIDES, head))
    result = forked_pytest(pytester, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=len(OVERRIDES))


# -- a str subclass given to the marker was read through its own __str__: a limit
# S('1 KiB') whose __str__ said '1 TiB' was a 1 TiB limit (a 1 MiB body passed), and a
# device whose __str__ said something else was named so in the failure.
SUBCLASSED = {
    "saying_a_larger_limit": f"{LIM}(S('1 KiB'))\ndef test_{{}}():\n",
    "saying_nothing": f"{LIM}(E('1 KiB'))\ndef test_{{}}():\n",
    "a_device_saying_another": f"{LIM}(S('1 KiB'), device=S('meta'))\ndef test_{{}}():\n",
}


def test_a_str_subclass_is_read_as_its_characters(pytester: pytest.Pytester) -> None:
    head = (
        "class S(str):\n    def __str__(self): return '1 TiB'\n"
        "class E(str):\n    def __str__(self): return ''\n"
    )
    pytester.makepyfile(test_sub=_tests(SUBCLASSED, head))
    result = forked_pytest(pytester, "-p", "no:cacheprovider")
    result.assert_outcomes(failed=len(SUBCLASSED))
    said = "peaked at 1.00 MiB on meta, over the limit 1.00 KiB"
    assert result.stdout.str().count(said) == len(SUBCLASSED)


# The same for a kernel's memprobe_inputs: a str subclass equal to anything passed
# "bogus" (each case's error a KeyError: 'bogus'), one whose __str__ said "hidden" over
# "logits" was refused as a hidden kernel without --hidden.
DECLARED = {
    "equal to anything": (
        "class S(str):\n    def __eq__(self, other): return True\n"
        "    __hash__ = str.__hash__\nk.memprobe_inputs = S('bogus')\n",
        "memprobe_inputs = 'bogus'",
    ),
    "saying another protocol": (
        "class S(str):\n    def __str__(self): return 'hidden'\nk.memprobe_inputs = S('logits')\n",
        None,
    ),
}


@pytest.mark.parametrize("what", DECLARED)
def test_a_declared_protocol_is_read_as_its_characters(run_cli: Any, here: Path, what: str) -> None:
    attribute, refused = DECLARED[what]
    body = KERNEL.format(fn="unchunked", after="pass", consumes=False) + attribute
    kernel = user_module(here, "r27_declared", body) + ":k"
    code, out, err = run_cli(*SWEEP, "--kernel", kernel)
    if refused:
        assert refused in one_line(code, out, err)
    else:
        assert code == 0, err
        assert [r["status"] for r in json.loads(out)["results"]] == ["ok"]


# -- a user's torch.library op answered from the memory of meta ops (measure.memo), which
# assumes an op's meta kernel computes from its arguments alone: torch's own do, a user's
# fake impl may read anything. A kernel whose op's workspace (or dtype) came from a
# global it set per chunk size was answered with the first case's: its 1.08 MiB peak at
# chunk 256 read as chunk 16's 144 KiB, status ok.
CUSTOM = (
    "import torch\nfrom memprobe.kernels import get_kernel\nSIZE = [0]\n"
    "@torch.library.custom_op('{lib}::scratch', mutates_args=())\n"
    "def scratch(x: torch.Tensor) -> torch.Tensor:\n"
    "    return torch.zeros(SIZE[0], device=x.device)\n"
    "@scratch.register_fake\ndef _(x):\n    return x.new_empty({fake})\n"
    "def k(logits, targets, *, chunk_size=None):\n"
    "    SIZE[0] = chunk_size * 1024\n"
    "    buf = scratch({arg})\n"
    "    return get_kernel('unchunked')(logits, targets) + buf[:1].sum() * 0\n"
)
OPS = {
    "its size from a global": ("SIZE[0], dtype=torch.float32", "targets"),
    "its dtype from a global": (
        "1 << 16, dtype=torch.float64 if SIZE[0] > 1 << 16 else torch.float16",
        "targets",
    ),
    "fed the logits": ("SIZE[0], dtype=torch.float32", "logits.detach()"),
}


@pytest.mark.parametrize("what", OPS)
def test_a_users_op_is_never_answered_from_memory(run_cli: Any, here: Path, what: str) -> None:
    fake, arg = OPS[what]
    lib = f"r27memo{abs(hash(what)) % 10**6}"
    kernel = user_module(here, "r27_memo", CUSTOM.format(lib=lib, fake=fake, arg=arg)) + ":k"
    peaks = []
    for chunks in ("16,256", "256"):
        code, out, err = run_cli(*SWEEP, "--kernel", kernel, "--chunk-size", chunks)
        assert code == 0, err
        peaks.append([r["peak_bytes"] for r in json.loads(out)["results"]])
    # chunk 256 swept after chunk 16 reads as chunk 256 alone, and above chunk 16.
    assert peaks[0][1] == peaks[1][0] > peaks[0][0]


def test_torchs_own_ops_are_still_answered_from_memory() -> None:
    import torch

    from memprobe.measure.memo import MetaMemo

    memo = MetaMemo()
    x = torch.empty(4, 8, device="meta")
    for _ in range(3):
        memo.call(torch.ops.aten.exp.default, (x,), {})
    assert memo.hits == 2


# -- an output replacing a module the user's code imported: only the step's (or kernel's)
# own file was an input, so `profile step:fn --out helper.py` replaced the helper module
# the step imported with a pickle (at its import, or lazily as it ran), as did `step
# --kernel mine:k --out helper.py` and `attribute --what-if mine:k --html helper.py`.
HELPED_STEP = (
    "import torch\n{top}\ndef step(device):\n    {lazy}\n"
    "    w = {helper}.make(device)\n    (w @ w).sum().backward()\n"
)
HELPER = (
    "import torch\ndef make(device):\n"
    "    return torch.zeros(8, 8, device=device, requires_grad=True)\n"
)


@pytest.mark.parametrize("when", ["imported with the step", "imported as it ran"])
@pytest.mark.parametrize("flag", ["--out", "--html"])
def test_an_output_never_replaces_a_module_the_step_imported(
    run_cli: Any, here: Path, when: str, flag: str
) -> None:
    helper = user_module(here, "r27_helper", HELPER + f"# {when} {flag}\n")
    line = f"import {helper}"
    top, lazy = (line, "pass") if when == "imported with the step" else ("", line)
    step = user_module(here, "r27_helped", HELPED_STEP.format(top=top, lazy=lazy, helper=helper))
    code, out, err = run_cli("profile", f"{step}:step", flag, f"{helper}.py")
    assert "would overwrite" in one_line(code, out, err)
    assert (here / f"{helper}.py").read_text().startswith("import torch")


HELPED_KERNEL = "import {helper}\ndef k(logits, targets, *, chunk_size=None):\n" + (
    "    return {helper}.u()(logits, targets)\n"
)
KERNEL_HELPER = (
    "from memprobe.kernels import get_kernel\ndef u():\n    return get_kernel('unchunked')\n"
)


def test_an_output_never_replaces_a_module_the_kernel_imported(run_cli: Any, here: Path) -> None:
    from small_config import SMALL

    (here / "config.json").write_text(json.dumps(SMALL))
    helper = user_module(here, "r27_khelper", KERNEL_HELPER)
    kernel = user_module(here, "r27_helped_k", HELPED_KERNEL.format(helper=helper)) + ":k"
    step = ["step", "--config", "config.json", "--tokens", "16"]
    code, out, err = run_cli(*step, "--kernel", kernel, "--out", f"{helper}.py")
    assert "would overwrite" in one_line(code, out, err)
    code, out, err = run_cli(*step, "--out", "snap.pickle")
    assert code == 0, err
    code, out, err = run_cli(
        "attribute", "snap.pickle", "--what-if", kernel, "--html", f"{helper}.py"
    )
    assert "would overwrite" in one_line(code, out, err)
    assert (here / f"{helper}.py").read_text() == KERNEL_HELPER


def test_an_output_named_as_a_module_elsewhere_is_written(run_cli: Any, here: Path) -> None:
    step_body = "import torch\ndef step(device):\n    torch.zeros(8, device=device)\n"
    step = user_module(here, "r27_plain", step_body)
    # os.py and json.py are loaded, from the standard library: these are new files.
    for name in ("os.py", "json.py"):
        code, out, err = run_cli("profile", f"{step}:step", "--out", name, "--json")
        assert code == 0, err
        assert (here / name).stat().st_size


# -- a result of a Tensor subclass (without __torch_function__, so not refused as one that
# answers for itself) whose plain properties and methods lie: memprobe read the result's
# shape, device, grad_fn and storage through them. A result computed in another thread
# whose untyped_storage() said it held nothing passed (its forward uncounted: 80 KiB, status
# ok, unchunked's being 112 KiB); the others failed with torch's words or the wrong reason.
LIARS = {
    "its storage, computed in a thread": (
        "    def untyped_storage(self): return torch.UntypedStorage(0, device=self.device)\n",
        "box = []; t = threading.Thread(target=lambda: box.append(U(logits, targets)))\n"
        "    t.start(); t.join(); out = box[0]",
        "allocated where memprobe cannot see it",
    ),
    "its shape": (
        "    shape = property(lambda self: torch.Size([1, 64]))\n",
        "out = U(logits, targets).unsqueeze(-1).expand(1, 64, 3)",
        "of shape [1, 64, 3]",
    ),
    "its dtype's kind": (
        "    def is_floating_point(self): return True\n",
        "out = (U(logits, targets) * 0).long()",
        "a int64 tensor",
    ),
    "its device": (
        "    device = property(lambda self: torch.device('meta'))\n",
        "out = torch.zeros(targets.shape)",
        "a tensor on cpu",
    ),
    "its graph": (
        "    requires_grad = property(lambda self: True)\n    grad_fn = property(lambda self: 1)\n",
        "out = U(logits, targets).detach()",
        "does not require grad",
    ),
}
LIAR = (
    "import threading, torch\nfrom memprobe.kernels import get_kernel\n"
    "U = get_kernel('unchunked')\n"
    "class Liar(torch.Tensor):\n{lie}"
    "def k(logits, targets, *, chunk_size=None):\n    {body}\n    return out.as_subclass(Liar)\n"
)


@pytest.mark.parametrize("lie", ["    shape = property(lambda self: 1 / 0)\n", "    pass\n"])
def test_a_true_result_of_a_subclass_is_measured(run_cli: Any, here: Path, lie: str) -> None:
    # A shape that raises (round 21 read it as the kernel's failure) is no lie about the
    # log-probs themselves: the result is torch's tensor underneath, measured as one.
    kernel = user_module(here, "r27_truth", LIAR.format(lie=lie, body="out = U(logits, targets)"))
    code, out, err = run_cli(*SWEEP, "--kernel", f"{kernel}:k,unchunked")
    assert code == 0, err
    rows = json.loads(out)["results"]
    assert [(r["status"], r["peak_bytes"]) for r in rows] == [("ok", 114944)] * 2


@pytest.mark.parametrize("what", LIARS)
def test_a_result_is_read_as_torch_reads_it(run_cli: Any, here: Path, what: str) -> None:
    lie, body, said = LIARS[what]
    kernel = user_module(here, "r27_liar", LIAR.format(lie=lie, body=body)) + ":k"
    code, out, err = run_cli(*SWEEP, "--kernel", f"{kernel},unchunked")
    assert code == 0, err
    rows = json.loads(out)["results"]
    assert [r["status"] for r in rows] == ["error", "ok"]
    assert said in rows[0]["note"] and "RuntimeError" not in rows[0]["note"]


# -- a device='cpu' marked body's meta tensors counted as CPU memory: the cpu tracker
# counted every device's storages, so a test that probed a shape on meta (a 1 TiB meta
# tensor, a model built under torch.device('meta')) failed a 1 MiB limit "peaked at 1.00
# TiB on cpu". Only cpu storages count; the cpu ones beside meta ones still do.
CPU_BODIES = {
    "probes_a_shape_on_meta": (
        "    big = torch.empty(1 << 40, dtype=torch.uint8, device='meta')\n"
        "    small = torch.zeros(1024)\n"
    ),
    "builds_a_module_on_meta": (
        "    with torch.device('meta'):\n        m = torch.nn.Linear(1 << 14, 1 << 14)\n"
    ),
    "meta_beside_cpu_over": (
        "    big = torch.empty(1 << 40, dtype=torch.uint8, device='meta')\n"
        "    x = torch.zeros(1 << 19)\n"
    ),
    "cpu_over": "    x = torch.zeros(1 << 19)\n",
}


def test_a_cpu_tests_meta_tensors_are_no_memory(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_cpu="import pytest, torch\n"
        + "".join(
            f"{LIM}('1 MiB', device='cpu')\ndef test_{name}():\n{body}"
            for name, body in CPU_BODIES.items()
        )
    )
    result = forked_pytest(pytester, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=2)
    assert result.stdout.str().count("peaked at 2.00 MiB on cpu, over the limit 1.00 MiB") == 2


# The same for a gradient: a custom Function's backward that gave a zero gradient as a
# subclass whose .double() answered the true one was checked against float64 with max
# |error| 0.0 backward (unchunked's own is 0.0067 in bf16); its .abs() lying alike.
GRADIENT_LIAR = (
    "import torch\nclass Liar(torch.Tensor):\n{lie}"
    "class F(torch.autograd.Function):\n"
    "    @staticmethod\n    def forward(ctx, logits, targets):\n"
    "        ctx.save_for_backward(logits, targets)\n"
    "        return torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None])[..., 0]\n"
    "    @staticmethod\n    def backward(ctx, g):\n"
    "        logits, targets = ctx.saved_tensors\n"
    "        with torch.enable_grad():\n"
    "            x = logits.detach().double().requires_grad_()\n"
    "            o = torch.log_softmax(x, -1).gather(-1, targets[..., None])[..., 0]\n"
    "            truth, = torch.autograd.grad(o, x, g.double())\n"
    "        wrong = torch.zeros_like(logits).as_subclass(Liar)\n"
    "        wrong.truth = truth\n        return wrong, None\n"
    "def k(logits, targets, *, chunk_size=None):\n    return F.apply(logits, targets)\n"
)
GRADIENT_LIES = {
    "its .double()": "    def double(self): return self.truth\n",
    "its .double() and .abs()": "    def double(self): return self\n"
    "    def abs(self): return torch.zeros_like(self.truth)\n",
}


@pytest.mark.parametrize("what", GRADIENT_LIES)
def test_a_gradient_is_checked_as_torch_reads_it(run_cli: Any, here: Path, what: str) -> None:
    body = GRADIENT_LIAR.format(lie=GRADIENT_LIES[what])
    kernel = user_module(here, "r27_grad_liar", body) + ":k"
    cpu = [a if a != "meta" else "cpu" for a in SWEEP if a != "--no-verify"]
    code, out, err = run_cli(*cpu, "--kernel", kernel)
    assert code == 0, err
    (row,) = json.loads(out)["results"]
    assert row["max_abs_err_bwd"] > 0.1 and row["max_abs_err_fwd"] < 1e-3


# -- the marker's verdict went through pytest.fail as the test body left it: a body that
# replaced it (monkeypatch.setattr(pytest, "fail", ...), undone only at teardown) made the
# verdict a no-op, and a 1 MiB body passed a 1 KiB limit.
REPLACED_FAIL = {
    "monkeypatched": "def test_{}(monkeypatch):\n"
    "    monkeypatch.setattr(pytest, 'fail', lambda *a, **k: None)\n",
    "replaced_for_good": "def test_{}():\n    pytest.fail = lambda *a, **k: None\n",
    "raising_something_else": "def test_{}(monkeypatch):\n"
    "    monkeypatch.setattr(pytest, 'fail', lambda *a, **k: pytest.skip('no'))\n",
}


def test_the_verdict_is_not_the_bodys_pytest_fail(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_fail="import pytest, torch\n"
        + "".join(f"{LIM}('1 KiB')\n" + t.format(n) + BODY for n, t in REPLACED_FAIL.items())
    )
    result = forked_pytest(pytester, "-p", "no:cacheprovider")
    result.assert_outcomes(failed=len(REPLACED_FAIL))
    said = "peaked at 1.00 MiB on meta, over the limit 1.00 KiB"
    assert result.stdout.str().count(said) == len(REPLACED_FAIL)


# -- a resume of a run whose user kernel was edited since it began: the finished rows
# measured the old code, the new rows the new one, all under one name (unchunked's code
# at 64 tokens, 3.51x its floor; local_chunked's at 128, 2.02x). run.json records each
# user kernel's source fingerprint; a resume that would mix two is one line.
EDITS = {
    "another kernel": ("local_chunked", "", True),
    "a comment": ("unchunked", "# edited\n", True),
    "nothing": ("unchunked", "", False),
}
VERSIONED = (
    "from memprobe.kernels import get_kernel\n"
    "def k(logits, targets, *, chunk_size=None):\n"
    "    return get_kernel('{fn}')(logits, targets, chunk_size=chunk_size)\n"
)


def _interrupted(run_cli: Any, here: Path, fn: str, stem: str) -> tuple[str, Path]:
    """A user kernel's run of two cases with the second one's row gone (as an interrupted
    run leaves it); the kernel's name and the run directory."""
    from memprobe import results

    # A name of its own per test: a module stays imported (and its kernel resolved) in
    # this process, where each command line is a process of its own.
    name = user_module(here, stem, VERSIONED.format(fn=fn))
    run = here / "run"
    flags = [a for a in SWEEP if a not in ("--tokens", "64", "--json")]
    code, out, err = run_cli(
        *flags, "--tokens", "64,128", "--kernel", f"{name}:k", "--out", str(run)
    )
    assert code == 0, err
    results.write_results(run, results.read_rows(run)[:1])
    return name, run


@pytest.mark.parametrize("what", EDITS)
def test_a_resume_never_mixes_two_versions_of_a_users_kernel(
    run_cli: Any, here: Path, what: str
) -> None:
    after, comment, refused = EDITS[what]
    stem = "r27_versioned_" + what.replace(" ", "_")
    name, run = _interrupted(run_cli, here, "unchunked", stem)
    (here / f"{name}.py").write_text(VERSIONED.format(fn=after) + comment)
    code, out, err = run_cli("sweep", "--resume", str(run), "--json")
    if refused:
        assert f"kernel '{name}:k' changed since the run began" in one_line(code, out, err)
        assert len(json.loads((run / "results.json").read_text())["rows"]) == 1
    else:
        assert code == 0, err
        assert [r["peak_bytes"] for r in json.loads(out)["results"]] == [114944, 229888]


def test_a_run_recording_no_sources_still_resumes(run_cli: Any, here: Path) -> None:
    name, run = _interrupted(run_cli, here, "unchunked", "r27_unrecorded")
    meta = json.loads((run / "run.json").read_text())
    del meta["kernel_sources"]  # a run made before memprobe recorded them
    (run / "run.json").write_text(json.dumps(meta))
    (here / f"{name}.py").write_text(VERSIONED.format(fn="local_chunked"))
    code, out, err = run_cli("sweep", "--resume", str(run), "--json")
    assert code == 0, err


# -- os._exit in a thread user code started, called as memprobe went on (a watchdog, a
# worker's "done"): the process ended there, a sweep after 4 of its 15 cases, exit status 0,
# no table and no word, read by CI as a success. It ends that thread alone, said on
# standard error; the sweep finishes with its own status.
EXITING = (
    "import os, threading, time\nfrom memprobe.kernels import get_kernel\n"
    "CALLS, DONE = [], []\n"
    "def _bye():\n    while not DONE:\n        time.sleep(0.005)\n    os._exit({status})\n"
    "def k(logits, targets, *, chunk_size=None):\n"
    "    CALLS.append(1)\n"
    "    if len(CALLS) == 1:\n        threading.Thread(target=_bye).start()\n"
    "    else:\n        DONE.append(1); {then}\n"
    "    return get_kernel('unchunked')(logits, targets)\n"
)
WHEN = {"during its call": "time.sleep(0.2)", "after it returned": "pass"}


@pytest.mark.multiprocess
@pytest.mark.parametrize("status", [0, 3])
@pytest.mark.parametrize("when", WHEN)
def test_an_exit_in_a_users_thread_ends_that_thread_alone(
    here: Path, when: str, status: int
) -> None:
    body = EXITING.format(status=status, then=WHEN[when])
    kernel = user_module(here, "r27_thread_exit", body) + ":k"
    flags = [a for a in SWEEP if a not in ("--tokens", "64")]
    done = forked_torchrun(
        [*flags, "--tokens", "64,128", "--kernel", f"{kernel},unchunked"], cwd=here, nproc=0
    )
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["results"]) == 4
    assert f"called os._exit({status}); it ended that thread alone" in done.stderr


def test_an_exit_in_a_users_thread_is_its_systemexit(capsys: pytest.CaptureFixture[str]) -> None:
    from memprobe.kernels import user_threads

    user_threads.threads_kept()
    ended: list[BaseException] = []

    def bye() -> None:
        try:
            os._exit(5)
        except SystemExit as exc:
            ended.append(exc)

    thread = threading.Thread(target=bye)
    user_threads.USERS_THREADS.add(thread)
    thread.start()
    thread.join()
    assert [e.code for e in ended] == [5]
    assert "called os._exit(5)" in capsys.readouterr().err


# -- os.chdir in a thread user code started, as memprobe went on: cwd_kept put back only
# what the code's own call moved, and the thread's later chdir split a sweep's run in two
# (run.json in run/, its results and snapshots in elsewhere/run), then ended it in "run is
# not a memprobe run", exit 2, every case measured. It is refused in that thread; the code's
# own call may still move (and memprobe puts it back).
MOVING = (
    "import os, threading, time\nfrom memprobe.kernels import get_kernel\n"
    "CALLS, DONE, SAID = [], [], []\n"
    "def _move():\n    while not DONE:\n        time.sleep(0.005)\n"
    "    try:\n        {move}\n    except OSError as exc:\n        SAID.append(exc)\n"
    "def k(logits, targets, *, chunk_size=None):\n"
    "    CALLS.append(1)\n"
    "    if len(CALLS) == 1:\n        threading.Thread(target=_move).start()\n"
    "    else:\n        DONE.append(1); time.sleep(0.1)\n"
    "    os.chdir('elsewhere'); os.chdir('..')  # its own call's moves\n"
    "    return get_kernel('unchunked')(logits, targets)\n"
)


MOVES = {
    "os.chdir": "os.chdir('elsewhere')",
    "os.fchdir": "os.fchdir(os.open('elsewhere', os.O_RDONLY))",
}


@pytest.mark.parametrize("move", MOVES)
def test_a_users_thread_never_moves_memprobes_directory(
    run_cli: Any, here: Path, move: str
) -> None:
    (here / "elsewhere").mkdir()
    body = MOVING.format(move=MOVES[move])
    kernel = user_module(here, "r27_thread_chdir", body) + ":k"
    flags = [a for a in SWEEP if a not in ("--tokens", "64", "--json")]
    code, out, err = run_cli(*flags, "--tokens", "64,128", "--kernel", kernel, "--out", "run")
    assert code == 0, err
    assert os.getcwd() == str(here)
    assert len(json.loads((here / "run" / "results.json").read_text())["rows"]) == 2
    assert not (here / "elsewhere" / "run").exists()
    said = __import__(kernel.split(":")[0]).SAID
    assert [e.errno for e in said] == [1]
