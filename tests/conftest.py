from __future__ import annotations

import gc
import os
import sys

# One CPU thread per test process (and the processes the tests start): the tests' tensors
# are tiny, and two pytest workers each running torch's intra-op pool on a 2-core machine
# spend most of their CPU spinning in OpenMP (tests/kernels/test_kernels.py: 36 s of CPU
# with the default pool, 5 s with one thread).
os.environ["OMP_NUM_THREADS"] = "1"

# Bytecode is cached even where the environment says not to (PYTHONDONTWRITEBYTECODE=1
# on the 2-core machine this suite is timed on): else every worker of every run compiled
# memprobe and assertion-rewrote each test module again (8 s of CPU per worker, about 3
# once cached), and each process a test starts compiled memprobe again (0.7 s). Only the
# writing is switched on: a read-only checkout reads what is there and writes nothing.
sys.dont_write_bytecode = False

import pytest  # noqa: E402

from memprobe import cli  # noqa: E402 - torch-free until a command needs it


def pytest_configure(config: pytest.Config) -> None:
    # Under -n the controller runs no test: it need not import torch, which it did before
    # any worker could start (2 s of the suite's wall time on 2 cores).
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _user_code_left_forgotten():
    """What a test's user code left (torch functions or builtins it replaced, modules it put
    in sys.modules, root logger handlers, torch state its module set as it was imported) is
    swapped in for every later user code of the process, as in one memprobe run: forgotten
    after each test, so no test runs another's (a replaced builtins.open that refused
    /dev/null failed a later test's step)."""
    yield
    if "memprobe.kernels.user_guards" in sys.modules:
        from memprobe.kernels import user_guards, user_hooks, user_torch

        user_guards._REPLACED.clear()
        user_hooks._MODULES_LEFT.clear()
        user_hooks._ROOT_LEFT.update(handlers=[], level=None)
        user_torch.forget_left()
    if "memprobe.measure.traced" in sys.modules:
        from memprobe.measure import traced

        traced._KEPT.clear()  # what one test's kernel kept is not another's
        traced._GIVEN.clear()
    if "memprobe.measure.fresh" in sys.modules:
        from memprobe.measure import fresh

        fresh._KEEPING.clear()


@pytest.fixture
def run_cli(monkeypatch, capsys):
    """Run ``memprobe ARGS`` through the real entry point; return (code, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["memprobe", *args])
        code = 0
        # sweep --alloc-conf sets PYTORCH_ALLOC_CONF for its own process (its allocator
        # reads it), which a later sweep in this one would read as the user's: each call
        # leaves it as it found it. (User code's own variables stay: a test asserts so.)
        kept = {n: os.environ.get(n) for n in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
        try:
            cli.main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            for name, value in kept.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        out, err = capsys.readouterr()
        return code, out, err

    return run


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Multi-process tests first: under ``-n auto`` the seconds-long launches then run
    beside the many quick tests instead of being the suite's tail on one worker. They
    are all in the first worker's share (xdist's worksteal deals out contiguous shares
    and steals from their ends), so one worker, not each, pays for the forkserver's
    preload (tests/launch.py: 5 s of CPU)."""
    items.sort(key=lambda item: item.get_closest_marker("multiprocess") is None)


def pytest_collection_finish(session: pytest.Session) -> None:
    # Everything imported so far (torch, transformers, memprobe, the test modules) lives
    # for the whole run: frozen, the cyclic collector stops rescanning it at every
    # full collection, which the many small tests otherwise pay for again and again.
    gc.freeze()
