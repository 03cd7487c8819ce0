"""Hostile inputs, round 19 (import machinery user code adds): each row is a variant of a
defect class the pass found. A finder on sys.meta_path (or a hook on sys.path_hooks) that
user code added and that raises for a name not its own is, while memprobe's own work runs,
a finder that does not find it; while user code runs it is as the code left it. A
KeyboardInterrupt still stops memprobe."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from hostile import user_module
from launch import forked_torchrun

SWEEP = ["sweep", "--vocab", "128", "--no-ladder", "--no-report", "-q"]
ON_META = [*SWEEP, "--device", "meta", "--no-verify"]
MINE = "unchunked,local_chunked"


@pytest.fixture(autouse=True)
def _importers_forgotten() -> Any:
    """The finders and hooks these tests' modules add stay in this process (as they would
    in one memprobe run): removed after each test, so that no later test imports through
    them."""
    from memprobe.kernels import user_hooks

    before = list(sys.meta_path), list(sys.path_hooks)
    yield
    sys.meta_path[:] = [f for f in sys.meta_path if any(f is b for b in before[0])]
    sys.path_hooks[:] = [h for h in sys.path_hooks if any(h is b for b in before[1])]
    sys.path_importer_cache.clear()
    user_hooks._WRAPPERS.clear()


# A finder raising for names it forbids (what memprobe imports after user code, and the
# fresh modules of _imports_work), and a path hook raising for every entry.
FORBIDDEN = ("memprobe", "matplotlib", "pandas", "jinja2", "r19_fresh", "colorsys")
FINDER = (
    "import sys\n"
    "class Hostile:\n"
    "    def {method}(self, name, path=None, target=None):\n"
    f"        if not name.startswith({FORBIDDEN!r}):\n"
    "            return None\n"
    "        raise {error}(f'no {{name}} here')\n"
)
# A finder claiming those names, with a loader that raises.
HIJACK = (
    "import importlib.abc, importlib.util, sys\n"
    "class Raising(importlib.abc.Loader):\n"
    "    def exec_module(self, module):\n"
    "        raise {error}(f'no {{module.__name__}} here')\n"
    "class Hostile:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    f"        if name.startswith({FORBIDDEN!r}):\n"
    "            return importlib.util.spec_from_loader(name, Raising())\n"
)
HOOK = "import sys\ndef hostile(entry):\n    raise {error}(f'no {{entry}} here')\n"
ADD_FINDER = "sys.meta_path.insert(0, Hostile())"
ADD_HOOK = "sys.path_hooks.insert(0, hostile); sys.path_importer_cache.clear()"


def _kernel(top: str, inside: str = "") -> str:
    """memprobe's unchunked kernel; its module runs ``top`` as it is imported, its call
    ``inside`` (once)."""
    return (
        f"from memprobe.kernels import get_kernel\n{top}\ncalls = []\n"
        "def k(logits, targets, *, chunk_size=None):\n"
        f"    if not calls:\n        {inside or 'pass'}\n"
        "    calls.append(1)\n"
        "    return get_kernel('unchunked')(logits, targets)\n"
    )


def _imports_work(here: Path) -> None:
    """What memprobe imports after user code: a module never imported before (matplotlib,
    pandas' writers), from a package's directory (found through the path hooks), one that
    is not there (an optional dependency probed: no finder finds it), and
    importlib.metadata's versions (every meta path finder is asked)."""
    package = here / f"r19_fresh_{len(list(here.iterdir()))}"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "inner.py").write_text("answer = 42\n")
    importlib.invalidate_caches()
    assert importlib.import_module(f"{package.name}.inner").answer == 42
    assert importlib.import_module("colorsys")  # a module of Python's own, maybe fresh
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("r19_fresh_absent")
    assert importlib.metadata.version("torch")


# -- G. A finder (or path hook) user code added that raised for a name not its own, as its
# module was imported or inside the call: the next import of memprobe's own ended the
# command in the finder's traceback (pandas writing results.csv, matplotlib drawing the
# report, `profile --html`'s page), after every case had run. So did one that claimed
# those names with a loader that raised: a module memprobe's own finders find is theirs,
# and one only the user's finder serves that fails to load is not found.
HOSTILE = {
    "finder raising ImportError, added at import": (
        FINDER.format(method="find_spec", error="ImportError") + ADD_FINDER,
        "",
    ),
    "finder raising RuntimeError, added at import": (
        FINDER.format(method="find_spec", error="RuntimeError") + ADD_FINDER,
        "",
    ),
    "finder raising RuntimeError, added in the call": (
        FINDER.format(method="find_spec", error="RuntimeError"),
        ADD_FINDER,
    ),
    "finder appended last, raising KeyError": (
        FINDER.format(method="find_spec", error="KeyError") + "sys.meta_path.append(Hostile())",
        "",
    ),
    "legacy finder (find_module only) raising": (
        FINDER.format(method="find_module", error="RuntimeError") + ADD_FINDER,
        "",
    ),
    "finder whose find_distributions raises": (
        FINDER.format(method="find_distributions", error="OSError").replace(
            f"if not name.startswith({FORBIDDEN!r}):\n            return None\n        ", ""
        )
        + "\n    def find_spec(self, *args):\n        return None\n"
        + ADD_FINDER,
        "",
    ),
    "finder claiming the names, its loader raising RuntimeError, added at import": (
        HIJACK.format(error="RuntimeError") + ADD_FINDER,
        "",
    ),
    "finder claiming the names, its loader raising ImportError, added in the call": (
        HIJACK.format(error="ImportError"),
        ADD_FINDER,
    ),
    "path hook raising RuntimeError, added at import": (
        HOOK.format(error="RuntimeError") + ADD_HOOK,
        "",
    ),
    "path hook raising ValueError, added in the call": (HOOK.format(error="ValueError"), ADD_HOOK),
}


@pytest.mark.parametrize("what", HOSTILE)
def test_a_raising_finder_user_code_added_finds_nothing_for_memprobe(
    run_cli: Any, here: Path, what: str
) -> None:
    top, inside = HOSTILE[what]
    name = user_module(here, "r19_finders", _kernel(top, inside))
    code, _, err = run_cli(*ON_META, "--tokens", "64", "--kernel", f"{name}:k,{MINE}", "--out", "o")
    assert code == 0, err
    rows = json.loads((here / "o" / "results.json").read_text())["rows"]
    assert [row["status"] for row in rows] == ["ok"] * 3
    assert sys.modules[name].calls
    _imports_work(here)


# The finder is the user's own, and stays: a legitimate one (six's importer, a plugin
# system's) serves the code's imports at its every call, and memprobe's after it; while
# user code runs, sys.meta_path holds the finder itself, not memprobe's view of it.
LEGITIMATE = (
    "import importlib.abc, importlib.util, sys\n"
    "class Virtual(importlib.abc.MetaPathFinder, importlib.abc.Loader):\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.startswith('r19_virtual_'):\n"
    "            return importlib.util.spec_from_loader(name, self)\n"
    "        if name == 'r19_broken':\n"
    "            raise RuntimeError('broken on purpose')\n"
    "        return None\n"
    "    def create_module(self, spec):\n"
    "        return None\n"
    "    def exec_module(self, module):\n"
    "        module.served = module.__name__\n"
    "VIRTUAL = Virtual()\n"
    "{add}\n"
    "from memprobe.kernels import get_kernel\n"
    "served, own, raised = [], [], []\n"
    "def k(logits, targets, *, chunk_size=None):\n"
    "    {inside}\n"
    "    own.append(any(f is VIRTUAL for f in sys.meta_path))\n"
    "    served.append(importlib.import_module(f'r19_virtual_{{len(served)}}').served)\n"
    "    try:\n"
    "        import r19_broken\n"
    "    except RuntimeError as exc:\n"
    "        raised.append(str(exc))\n"
    "    return get_kernel('unchunked')(logits, targets)\n"
)
ADD_VIRTUAL = "sys.meta_path.insert(0, VIRTUAL)"
PLACED = {
    "added at import": (ADD_VIRTUAL, "pass"),
    "added in the first call": ("", f"{ADD_VIRTUAL} if not served else None"),
}


@pytest.mark.parametrize("placed", PLACED)
def test_a_legitimate_finder_keeps_serving_user_code(run_cli: Any, here: Path, placed: str) -> None:
    add, inside = PLACED[placed]
    body = LEGITIMATE.format(add=add, inside=inside)
    name = user_module(here, "r19_legit", body)
    # Two token counts: the kernel is called twice, its finder consulted at each call.
    flags = [*ON_META, "--tokens", "32,64", "--kernel", f"{name}:k,unchunked"]
    code, _, err = run_cli(*flags, "--out", "o")
    assert code == 0, err
    module = sys.modules[name]
    calls = len(module.served)
    assert calls >= 2, module.served  # a kernel called more than once
    assert module.served == [f"r19_virtual_{n}" for n in range(calls)]
    assert all(module.own), module.own
    # Its own exception reaches its own code, as it raised it.
    assert module.raised == ["broken on purpose"] * calls
    # ...and memprobe's imports after it go through its view of the same finder.
    assert importlib.import_module("r19_virtual_after").served == "r19_virtual_after"
    assert not any(f is module.VIRTUAL for f in sys.meta_path)
    _imports_work(here)


# A KeyboardInterrupt from a finder, or any BaseException that is not an Exception, is not
# "not found": a Ctrl-C (or torchrun's SIGTERM raising SystemExit) that fires while the
# finder runs must stop memprobe wherever it is, so it passes through the view as it is.
@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit])
def test_a_stop_inside_a_finder_still_stops(here: Path, error: type[BaseException]) -> None:
    from memprobe.kernels.user_hooks import importers_kept

    class Stopping:
        def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
            if name == "r19_stopped":
                raise error()

    with importers_kept():
        sys.meta_path.insert(0, Stopping())
    with pytest.raises(error):
        importlib.import_module("r19_stopped")


# End to end, in a process of its own (in this one, what memprobe imports lazily was
# imported by earlier tests): sweep's report, profile's page and plan, with a finder that
# raises for what memprobe imports after the code (memprobe's own modules, matplotlib,
# pandas, jinja2). Forked from tests/launch.py's server: torch and memprobe's commands
# are imported there, what a command imports as it runs (its pages, matplotlib, jinja2,
# pandas' writers) is not.
BLOCKING = (
    "import sys\n"
    "class Hostile:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.startswith(('memprobe', 'matplotlib', 'pandas', 'jinja2')):\n"
    "            raise RuntimeError(f'no {name} here')\n"
    "sys.meta_path.insert(0, Hostile())\n"
)
STEP = "import torch\ndef step(device):\n    (torch.zeros(8, 8, device=device) * 2).sum()\n"
COMMANDS = {
    "sweep and its report": (
        _kernel(BLOCKING),
        ["sweep", "--tokens", "64", "--vocab", "128", "--no-ladder", "--device", "meta"],
        ["--no-verify", "-q", "--kernel", "{name}:k,unchunked", "--out", "o"],
    ),
    "profile --html": (
        BLOCKING + STEP,
        ["profile", "{name}:step", "--device", "cpu"],
        ["--html", "page.html"],
    ),
    "plan --kernel": (
        _kernel(BLOCKING),
        ["plan", "--kernel", "{name}:k", "--vocab", "32000"],
        ["--budget", "1GiB"],
    ),
}


@pytest.mark.multiprocess
@pytest.mark.parametrize("command", COMMANDS)
def test_commands_end_well_after_a_raising_finder(here: Path, command: str) -> None:
    body, *flags = COMMANDS[command]
    name = user_module(here, "r19_blocking", body)
    argv = [flag.format(name=name) for part in flags for flag in part]
    done = forked_torchrun(argv, cwd=here, nproc=0, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
