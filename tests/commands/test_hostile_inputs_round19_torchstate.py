"""Hostile inputs, round 19 (torch's process-wide state user code changes): each row is a
variant of a defect class the pass found. memprobe's own work after user code (the other
kernels of a sweep, the reference, the report, the next test of a pytest session) runs
under torch's state as memprobe had it; what a module sets as it is imported is its own,
swapped in for its code alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hostile import TINY_STEP, swept, user_module
from launch import forked_pytest

pytest_plugins = ["pytester"]

SWEEP = ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--no-report", "-q"]
ON_META = [*SWEEP, "--device", "meta", "--no-verify"]
# On cpu with the reference: a kernel's peak and its errors against it.
ON_CPU = [*SWEEP, "--device", "cpu"]
MINE = "unchunked,local_chunked"


def torch_state() -> dict[str, Any]:
    """torch's process-wide state, read here independently of memprobe's guard."""
    import torch
    import torch.utils.deterministic

    b = torch.backends
    try:
        precision = torch.get_float32_matmul_precision()
    except RuntimeError:  # the old and the new settings mixed
        precision = "mixed"
    return {
        "gradients": torch.is_grad_enabled(),
        "dtype": torch.get_default_dtype(),
        "device": torch.get_default_device(),
        "made on": torch.empty(0).device,
        "anomaly": (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
        "autocast": torch.is_autocast_enabled("cpu"),
        "threads": torch.get_num_threads(),
        "precision": precision,
        "backends": [o.fp32_precision for o in (b.cuda.matmul, b.mkldnn.matmul, b.cudnn.conv)],
        "tf32": b.cuda.matmul.allow_tf32,
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "warn only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "fill": torch.utils.deterministic.fill_uninitialized_memory,
        "warn always": torch.is_warn_always_enabled(),
        "cudnn": (b.cudnn.enabled, b.cudnn.benchmark, b.cudnn.deterministic),
        "fp16 reduction": b.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "function modes": torch._C._len_torch_function_stack(),
        "dispatch modes": torch._C._len_torch_dispatch_stack(),
        "hooks": torch._C._autograd._top_saved_tensors_default_hooks(False),
        "hooks disabled": torch._C._autograd._saved_tensors_hooks_get_disabled_error_message(),
    }


def _rows(run: Path) -> dict[str, dict[str, Any]]:
    rows = json.loads((run / "results.json").read_text())["rows"]
    return {row["kernel"]: row for row in rows}


def _reading(row: dict[str, Any]) -> tuple[Any, ...]:
    return row["status"], row["peak_bytes"], row["max_abs_err_fwd"], row["max_abs_err_bwd"]


# Pass-through modes and hooks a module enters, counting what they see.
MODES = (
    "import torch\nfrom torch.overrides import TorchFunctionMode\n"
    "from torch.utils._python_dispatch import TorchDispatchMode\n"
    "class Functions(TorchFunctionMode):\n"
    "    def __torch_function__(self, func, types, args=(), kwargs=None):\n"
    "        return func(*args, **(kwargs or {}))\n"
    "class Dispatches(TorchDispatchMode):\n"
    "    def __torch_dispatch__(self, func, types, args=(), kwargs=None):\n"
    "        return func(*args, **(kwargs or {}))\n"
)


def _kernel(top: str, inside: str = "", seen: str = "True") -> str:
    """A kernel (memprobe's unchunked) whose module runs ``top`` as it is imported, whose
    call runs ``inside``, and which records whether ``seen`` held as it was called."""
    return (
        MODES + "import torch.utils.deterministic\nfrom memprobe.kernels import get_kernel\n"
        f"seen = []\n{top}\n"
        "def k(logits, targets, *, chunk_size=None):\n"
        f"    seen.append(bool({seen}))\n"
        "    out = get_kernel('unchunked')(logits, targets)\n"
        f"{inside}"
        "    return out\n"
    )


# -- A. settings user code changed and left (torch.set_num_threads,
# set_float32_matmul_precision, use_deterministic_algorithms, fill_uninitialized_memory,
# cuDNN's and cuBLAS's flags): none of them was put back, so every case after the code's,
# memprobe's own kernels and its reference ran under them: on one thread, fp32 matmuls in
# bf16 (oneDNN) or TF32, CUDA backwards without a deterministic implementation failing.

SETTINGS = {
    "one thread": "torch.set_num_threads(1)",
    "one thread more": "torch.set_num_threads(torch.get_num_threads() + 1)",
    "matmul precision medium": "torch.set_float32_matmul_precision('medium')",
    "matmul precision high": "torch.set_float32_matmul_precision('high')",
    "oneDNN matmuls in bf16": "torch.backends.mkldnn.matmul.fp32_precision = 'bf16'",
    "old and new precision mixed": "torch.set_float32_matmul_precision('high'); "
    "torch.backends.mkldnn.matmul.fp32_precision = 'bf16'",
    "TF32 by the old flag": "torch.backends.cuda.matmul.allow_tf32 = True",
    "cuDNN TF32 off": "torch.backends.cudnn.allow_tf32 = False",
    "deterministic": "torch.use_deterministic_algorithms(True)",
    "deterministic, warn only": "torch.use_deterministic_algorithms(True, warn_only=True)",
    "uninitialized memory left as it is": "torch.utils.deterministic."
    "fill_uninitialized_memory = False",
    "cuDNN benchmark": "torch.backends.cudnn.benchmark = True",
    "cuDNN deterministic": "torch.backends.cudnn.deterministic = True",
    "cuDNN off": "torch.backends.cudnn.enabled = False",
    "fp16 reductions exact": "torch.backends.cuda.matmul."
    "allow_fp16_reduced_precision_reduction = False",
    "warnings always": "torch.set_warn_always(True)",
}


@pytest.mark.parametrize("what", SETTINGS)
def test_settings_a_kernel_changes_are_put_back(run_cli: Any, here: Path, what: str) -> None:
    before = torch_state()
    name = user_module(here, "r19_setting", _kernel("", f"    {SETTINGS[what]}\n"))
    code, _, err = run_cli(*ON_META, "--kernel", f"{name}:k,{MINE}", "--out", "o")
    assert code == 0, err
    assert all(row["status"] == "ok" for row in _rows(here / "o").values())
    assert torch_state() == before


@pytest.mark.parametrize("what", ["kernel", "step"])
def test_settings_user_code_changes_are_put_back_all_at_once(
    run_cli: Any, here: Path, what: str
) -> None:
    before = torch_state()
    inside = "".join(f"    {line}\n" for line in SETTINGS.values())
    if what == "kernel":
        name = user_module(here, "r19_settings", _kernel("", inside))
        code, _, err = run_cli(*ON_META, "--kernel", f"{name}:k,{MINE}", "--out", "o")
    else:
        step = "import torch.utils.deterministic\n" + TINY_STEP + inside
        name = user_module(here, "r19_settings_step", step)
        code, _, err = run_cli("profile", f"{name}:step", "--json")
    assert code == 0, err
    assert torch_state() == before


# -- B. torch state a user's module set as it was imported (gradients off, a default
# dtype or device, anomaly detection, autocast, a mode or hooks entered at module level
# and never left): only a call was guarded, so the state stayed on for memprobe's own
# kernels and reference: module-level gradients off failed every case of the sweep, a
# default dtype of float64 changed memprobe's kernels' peaks (unchunked 114,944 B read
# 115,200 B) and errors, a default device of meta ended the sweep in a traceback, a
# function mode failed every case. Now it is the module's own: its kernel sees it, and
# memprobe's kernels read what they read without it.

AT_IMPORT = {
    "gradients off": ("torch.set_grad_enabled(False)", "not torch.is_grad_enabled()"),
    "no_grad entered": ("torch.no_grad().__enter__()", "not torch.is_grad_enabled()"),
    "float64 by default": (
        "torch.set_default_dtype(torch.float64)",
        "torch.get_default_dtype() == torch.float64",
    ),
    "float16 by default": (
        "torch.set_default_dtype(torch.float16)",
        "torch.get_default_dtype() == torch.float16",
    ),
    "meta by default": ("torch.set_default_device('meta')", "torch.empty(0).is_meta"),
    "meta entered": ("torch.device('meta').__enter__()", "torch.empty(0).is_meta"),
    "anomaly detection": ("torch.autograd.set_detect_anomaly(True)", "torch.is_anomaly_enabled()"),
    "anomaly detection entered": (
        "torch.autograd.detect_anomaly().__enter__()",
        "torch.is_anomaly_enabled()",
    ),
    "autocast entered": (
        "torch.autocast('cpu', dtype=torch.bfloat16).__enter__()",
        "torch.is_autocast_enabled('cpu')",
    ),
    "a function mode": ("Functions().__enter__()", "torch._C._len_torch_function_stack()"),
    "a dispatch mode": (
        "Dispatches().__enter__()",
        "any(isinstance(m, Dispatches) for m in "
        "torch.utils._python_dispatch._get_current_dispatch_mode_stack())",
    ),
    "saved-tensor hooks": (
        "torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t).__enter__()",
        "torch._C._autograd._top_saved_tensors_default_hooks(False)",
    ),
    "saved-tensor hooks disabled": (
        "kept = torch.autograd.graph.disable_saved_tensors_hooks('mine'); kept.__enter__()",
        "torch._C._autograd._saved_tensors_hooks_get_disabled_error_message() == 'mine'",
    ),
    "save_on_cpu": (
        "torch.autograd.graph.save_on_cpu().__enter__()",
        "torch._C._autograd._top_saved_tensors_default_hooks(False)",
    ),
    "one thread more": (
        "threads = torch.get_num_threads() + 1; torch.set_num_threads(threads)",
        "torch.get_num_threads() == threads",
    ),
    "deterministic": (
        "torch.use_deterministic_algorithms(True)",
        "torch.are_deterministic_algorithms_enabled()",
    ),
    "matmul precision medium": (
        "torch.set_float32_matmul_precision('medium')",
        "torch.get_float32_matmul_precision() == 'medium'",
    ),
}


@pytest.fixture(scope="module")
def clean_rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """memprobe's kernels swept on cpu (with the reference) with no user code before them."""
    return _rows(swept(tmp_path_factory.mktemp("clean") / "run", *ON_CPU[1:], "--kernel", MINE))


# The settings go through one guard (what an import leaves, swapped in for its code):
# set at once, in two groups of settings that do not undo each other.
AT_IMPORT_GROUPS = [
    (
        "gradients off", "float64 by default", "meta by default", "anomaly detection",
        "autocast entered", "a function mode", "saved-tensor hooks", "one thread more",
        "deterministic", "matmul precision medium", "save_on_cpu",
    ),
    (
        "no_grad entered", "float16 by default", "meta entered", "anomaly detection entered",
        "a dispatch mode", "saved-tensor hooks disabled",
    ),
]  # fmt: skip


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")
@pytest.mark.parametrize("group", AT_IMPORT_GROUPS, ids=["group 1", "group 2"])
def test_state_a_kernels_module_sets_as_it_is_imported_is_its_own(
    run_cli: Any, here: Path, group: tuple[str, ...], clean_rows: dict[str, dict[str, Any]]
) -> None:
    assert sorted(n for g in AT_IMPORT_GROUPS for n in g) == sorted(AT_IMPORT)
    before = torch_state()
    top = "\n".join(AT_IMPORT[what][0] for what in group)
    seen = ", ".join(f"bool({AT_IMPORT[what][1]})" for what in group)
    name = user_module(here, "r19_at_import", _kernel(top, seen=f"all(({seen},))"))
    code, _, err = run_cli(*ON_CPU, "--kernel", f"{name}:k,{MINE}", "--out", "o")
    assert code == 0, err
    rows = _rows(here / "o")
    for kernel in MINE.split(","):
        assert _reading(rows[kernel]) == _reading(clean_rows[kernel]), rows[kernel]["note"]
    assert torch_state() == before
    import sys

    seen_by_kernel = sys.modules[name].seen
    assert seen_by_kernel and all(seen_by_kernel)  # what its module set up


STEP_AT_IMPORT = {
    name: AT_IMPORT[name]
    for name in (
        "float64 by default",
        "meta by default",
        "a function mode",
        "a dispatch mode",
        "autocast entered",
        "one thread more",
        "deterministic",
    )
}


@pytest.mark.parametrize("what", STEP_AT_IMPORT)
def test_state_a_steps_module_sets_as_it_is_imported_is_its_own(
    run_cli: Any, here: Path, what: str
) -> None:
    before = torch_state()
    top, seen = STEP_AT_IMPORT[what]
    body = MODES + f"seen = []\n{top}\n" + TINY_STEP + f"    seen.append(bool({seen}))\n"
    name = user_module(here, "r19_step_import", body)
    code, out, err = run_cli("profile", f"{name}:step", "--json")
    assert code == 0 and json.loads(out), err
    assert torch_state() == before
    import sys

    assert sys.modules[name].seen == [True]


def test_state_two_modules_set_is_theirs_alike(run_cli: Any, here: Path) -> None:
    # The second module imported sees the first's (a user's code is one body of code), and
    # both kernels see what both set up; memprobe's own kernel neither.
    first = user_module(here, "r19_first", _kernel("torch.set_num_threads(3)"))
    both = "torch.get_num_threads() == 3 and torch.are_deterministic_algorithms_enabled()"
    second = user_module(
        here, "r19_second", _kernel("torch.use_deterministic_algorithms(True)", seen=both)
    )
    before = torch_state()
    kernels = f"{first}:k,unchunked,{second}:k"
    code, _, err = run_cli(*ON_META, "--kernel", kernels, "--out", "o")
    assert code == 0, err
    assert all(row["status"] == "ok" for row in _rows(here / "o").values())
    assert torch_state() == before
    import sys

    assert sys.modules[second].seen and all(sys.modules[second].seen)


# -- C. the pytest marker and a test body that left a mode entered (a TorchDispatchMode, a
# TorchFunctionMode, torch.device('meta').__enter__()): leaving the meta device and the
# tracker pops the top of torch's stacks, so the body's mode was popped in their place:
# memprobe's tracker stayed on, recording every later test, or the meta default device
# stayed for every later test (their tensors meta, their values unreadable). Defaults the
# body changed (gradients off, float64) stayed too. After a marked test, torch's state is
# as before it, and the body's peak is read as it would be without the mode.

LEFT_BY_A_BODY = {
    "a dispatch mode": ("meta", "Dispatches().__enter__()"),
    "a function mode": ("meta", "Functions().__enter__()"),
    "both modes": ("meta", "Functions().__enter__(); Dispatches().__enter__()"),
    "meta entered": ("meta", "torch.device('meta').__enter__()"),
    "cpu entered on meta": ("meta", "torch.device('cpu').__enter__()"),
    "a default device": ("meta", "torch.set_default_device('meta')"),
    "gradients off": ("meta", "torch.set_grad_enabled(False)"),
    "float64 by default": ("meta", "torch.set_default_dtype(torch.float64)"),
    # On cpu: CPU autocast is not applied on meta, and a marked body fails there (round 34).
    "autocast entered": ("cpu", "torch.autocast('cpu', dtype=torch.bfloat16).__enter__()"),
    "one thread more": ("meta", "torch.set_num_threads(torch.get_num_threads() + 1)"),
    "a dispatch mode on cpu": ("cpu", "Dispatches().__enter__()"),
    "meta entered on cpu": ("cpu", "torch.device('meta').__enter__()"),
    "saved-tensor hooks on cpu": (
        "cpu",
        "torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t).__enter__()",
    ),
}


def _marked_tests() -> str:
    import inspect

    body = [
        "from typing import Any\nimport pytest\n" + MODES,
        inspect.getsource(torch_state),
        "BEFORE = torch_state()\n",
    ]
    for i, (device, left) in enumerate(LEFT_BY_A_BODY.values()):
        body.append(
            f"@pytest.mark.limit_peak_memory('1.5 MiB', device={device!r})\n"
            f"def test_{i:02}_marked():\n"
            "    x = torch.empty(256, 1024)  # 1 MiB\n"
            f"    {left}\n"
            "    del x\n"
            f"def test_{i:02}_after():\n"
            "    assert torch_state() == BEFORE\n"
            "    assert torch.empty(1).device.type == 'cpu'\n"
        )
    # A body over its limit after the same: the peak is the body's own (2 MiB), read so.
    body.append(
        "@pytest.mark.limit_peak_memory('1 MiB')\n"
        "def test_zz_over():\n"
        "    Dispatches().__enter__()\n"
        "    torch.empty(512, 1024)\n"
    )
    return "\n".join(body)


@pytest.mark.multiprocess
def test_the_marker_leaves_torchs_state_as_it_was(pytester: pytest.Pytester) -> None:
    from importlib.metadata import entry_points

    installed = any(
        ep.value == "memprobe.commands.pytest_plugin" for ep in entry_points(group="pytest11")
    )
    pytester.makepyfile(test_marked=_marked_tests())
    args = () if installed else ("-p", "memprobe.commands.pytest_plugin")
    # In a process of its own: a mode left on here would be on for this session's tests.
    result = forked_pytest(pytester, "--strict-markers", "-p", "no:cacheprovider", *args)
    result.assert_outcomes(passed=2 * len(LEFT_BY_A_BODY), failed=1)
    result.stdout.fnmatch_lines(["*torch tensors peaked at 2.00 MiB on meta, over the limit*"])


# -- D (the fresh pass). resource limits user code lowered or raised: a kernel that set
# RLIMIT_FSIZE to 100 bytes failed the sweep at its first snapshot ("cannot write
# snapshot ... File too large"), a CPU-time limit ended the process with SIGXCPU in
# memprobe's own later work. Soft limits are put back; the ones here are harmless to
# leave in a test process, where the defect would leave them.

LIMITS = {
    "file size 100 bytes": "soft(resource.RLIMIT_FSIZE, 100)",
    "an hour more CPU time": "soft(resource.RLIMIT_CPU, int(time.process_time()) + 3600)",
    "one open file fewer": "soft(resource.RLIMIT_NOFILE, "
    "resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 1)",
    "an address space of 64 TiB": "soft(resource.RLIMIT_AS, 2**46)",
    "a data segment of 64 TiB": "soft(resource.RLIMIT_DATA, 2**46)",
}
# Only the soft limit: a hard limit lowered cannot be raised again.
SOFT = (
    "import resource, time\n"
    "def soft(kind, value):\n"
    "    resource.setrlimit(kind, (value, resource.getrlimit(kind)[1]))\n"
)


def _limits() -> list[tuple[int, int]]:
    import resource

    kinds = ("RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_AS", "RLIMIT_DATA")
    return [resource.getrlimit(getattr(resource, kind)) for kind in kinds]


@pytest.mark.parametrize("what", LIMITS)
def test_resource_limits_a_kernel_changes_are_put_back(run_cli: Any, here: Path, what: str) -> None:
    pytest.importorskip("resource")
    before = _limits()
    name = user_module(here, "r19_limits", _kernel(SOFT, f"    {LIMITS[what]}\n"))
    code, _, err = run_cli(*ON_META, "--kernel", f"{name}:k,{MINE}", "--out", "o")
    assert code == 0, err
    assert all(row["status"] == "ok" for row in _rows(here / "o").values())
    assert _limits() == before


# -- E (the fresh pass). Python's builtins a module replaced as it was imported: a
# builtins.open that raised for paths not its own (a sandbox, a file-access tracer) ended
# the sweep in its PermissionError as memprobe wrote the report, after every case had run.
# A replacement is the code's own, swapped in while it runs (as torch functions are).

BUILTINS = {
    "open that refuses other paths": (
        "_open = builtins.open\n"
        "def mine(file, *args, **kwargs):\n"
        "    if 'r19_builtins' not in str(file):\n"
        "        raise PermissionError(f'not mine: {file}')\n"
        "    return _open(file, *args, **kwargs)\n"
        "builtins.open = mine\n",
        "builtins.open is mine",
    ),
    "print for rank 0 only": (
        "def mine(*args, **kwargs):\n    pass\nbuiltins.print = mine\n",
        "builtins.print is mine",
    ),
    "round gone": ("mine = None\nbuiltins.round = mine\n", "builtins.round is mine"),
}


@pytest.mark.parametrize("what", BUILTINS)
def test_builtins_a_module_replaces_are_its_own(run_cli: Any, here: Path, what: str) -> None:
    import builtins
    import sys

    before = dict(vars(builtins))
    top, seen = BUILTINS[what]
    name = user_module(here, "r19_builtins", _kernel("import builtins\n" + top, seen=seen))
    code, _, err = run_cli(*ON_CPU, "--kernel", f"{name}:k,{MINE}", "--out", "o")
    assert code == 0, err
    rows = _rows(here / "o")
    assert all(row["status"] == "ok" for kernel, row in rows.items() if kernel in MINE)
    assert {n: v for n, v in vars(builtins).items() if n in before} == before
    assert sys.modules[name].seen and all(sys.modules[name].seen)


# -- F (the fresh pass). Python's import machinery a module emptied as it was imported
# (sys.path_hooks or sys.meta_path cleared, or replaced by an empty list): every import of
# memprobe's after it failed, the sweep ended in a ModuleNotFoundError from pandas writing
# results.csv, a traceback and no results at all. Entries removed are put back, as
# sys.path's are.

IMPORTERS = {
    "path hooks cleared": "sys.path_hooks.clear(); sys.path_importer_cache.clear()",
    "path hooks replaced": "sys.path_hooks = []; sys.path_importer_cache.clear()",
    "meta path cleared": "sys.meta_path.clear()",
    "meta path replaced": "sys.meta_path = []",
    "meta path without its path finder": "sys.meta_path[:] = sys.meta_path[:-1]",
}


@pytest.mark.parametrize("what", IMPORTERS)
def test_import_machinery_a_module_empties_is_put_back(run_cli: Any, here: Path, what: str) -> None:
    import sys

    before = list(sys.meta_path), list(sys.path_hooks)
    name = user_module(here, "r19_importers", _kernel(f"import sys\n{IMPORTERS[what]}\n"))
    code, _, err = run_cli(*ON_META, "--kernel", f"{name}:k,{MINE}", "--out", "o")
    assert code == 0, err
    assert all(row["status"] == "ok" for row in _rows(here / "o").values())
    assert all(f in sys.meta_path for f in before[0]), sys.meta_path
    assert all(h in sys.path_hooks for h in before[1]), sys.path_hooks
