"""A user kernel by import path: ``package.module:function`` -> KernelSpec, or a UserError."""

from __future__ import annotations

import re
import textwrap

import pytest
import torch

from memprobe.errors import UserError
from memprobe.kernels import get_kernel, get_spec
from memprobe.kernels.user import resolve_user_kernel

SOURCE = '''
import torch

def logits_fn(logits, targets, *, chunk_size=None):
    """Plain log_softmax + gather."""
    return torch.log_softmax(logits.float(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)

def hidden_fn(hidden, weight, targets, *, chunk_size=None, temperature=1.0):
    return logits_fn(hidden @ weight.t(), targets)

def kwargs_fn(logits, targets, **options):
    return logits_fn(logits, targets)

def declared(*args, chunk_size=None):
    return hidden_fn(*args)
declared.memprobe_inputs = "hidden"

def inplace(logits, targets, chunk_size=None):
    return logits_fn(logits, targets)
inplace.memprobe_consumes_logits = True

def one_arg(logits, *, chunk_size=None):
    return logits

def no_chunk(logits, targets):
    return logits

def star_args(*args, chunk_size=None):
    return args[0]

def bad_declared(logits, targets, *, chunk_size=None):
    return logits
bad_declared.memprobe_inputs = "tokens"

class Kernels:
    @staticmethod
    def nested(logits, targets, *, chunk_size=None):
        return logits_fn(logits, targets)

NOT_CALLABLE = 3
'''


@pytest.fixture
def module(tmp_path, monkeypatch, request):
    name = f"userkernels_{request.node.name.replace('[', '_').replace(']', '').replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_logits_and_hidden_protocols_are_told_by_signature(module):
    spec = get_spec(f"{module}:logits_fn")
    assert spec.name == f"{module}:logits_fn" and spec.inputs == "logits"
    assert spec.summary == "Plain log_softmax + gather." and not spec.consumes_logits
    assert get_spec(f"{module}:hidden_fn").inputs == "hidden"
    assert get_spec(f"{module}:kwargs_fn").inputs == "logits"
    assert get_spec(f"{module}:Kernels.nested").inputs == "logits"
    logits, targets = torch.randn(1, 3, 5), torch.tensor([[0, 4, 2]])
    out = get_kernel(f"{module}:logits_fn")(logits, targets, chunk_size=None)
    assert out.shape == (1, 3)


def test_attributes_override_the_signature(module):
    assert get_spec(f"{module}:declared").inputs == "hidden"
    assert get_spec(f"{module}:inplace").consumes_logits


@pytest.mark.parametrize(
    "attr, message",
    [
        ("one_arg", "takes 1 positional arguments (logits), expected 2"),
        ("no_chunk", "takes no chunk_size keyword"),
        ("star_args", "takes *args, so its protocol is ambiguous"),
        ("bad_declared", "memprobe_inputs = 'tokens'"),
        ("NOT_CALLABLE", "is a int, not a callable"),
        ("missing", "has no attribute 'missing'"),
    ],
)
def test_a_wrong_kernel_is_a_user_error(module, attr, message):
    with pytest.raises(UserError, match=re.escape(message)) as info:
        get_spec(f"{module}:{attr}")
    assert info.value.hint and "\n" not in info.value.one_line()


def test_an_import_that_fails_is_a_user_error(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="cannot import .no_such_package_xyz.mod."):
        resolve_user_kernel("no_such_package_xyz.mod:fn")
    (tmp_path / "broken_kernels_mod.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError, match="RuntimeError: boom"):
        resolve_user_kernel("broken_kernels_mod:fn")
    for bad in ("a.b:", ":fn", "a b:fn", "mod:fn:x"):
        with pytest.raises(UserError, match="not an import path"):
            resolve_user_kernel(bad)


def test_the_current_directory_is_tried_when_the_package_is_not_installed(tmp_path, monkeypatch):
    (tmp_path / "cwd_kernels_mod.py").write_text(textwrap.dedent(SOURCE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", ".")])
    assert resolve_user_kernel("cwd_kernels_mod:logits_fn").inputs == "logits"


def test_plain_names_are_not_import_paths():
    with pytest.raises(ValueError, match="package.module:function"):
        get_spec("nope")


def test_a_file_name_for_a_module_says_to_name_the_module(tmp_path, monkeypatch) -> None:
    from memprobe.errors import UserError
    from memprobe.kernels.user import import_callable

    (tmp_path / "my_step_file.py").write_text("def step(device):\n    return None\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as caught:
        import_callable("my_step_file.py:step", what="step", hint="")
    assert caught.value.hint == "name the module, not its file: my_step_file:step"
