"""The allocator model is pure Python: importing it must not import torch."""

from __future__ import annotations

import subprocess
import sys


def test_import_pulls_in_no_torch():
    code = (
        "import sys\n"
        "import memprobe.allocator, memprobe.allocator.config, memprobe.allocator.model\n"
        "import memprobe.allocator.snapshot_replay, memprobe.allocator.simulate\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "mine = sorted(m for m in sys.modules if m.startswith('memprobe.'))\n"
        "print(bad, mine)\n"
        "assert not bad, bad\n"
        "ok = ('memprobe.allocator', 'memprobe.errors')\n"
        "assert all(m.startswith(ok) for m in mine), mine\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
