"""How the multi-process tests start torchrun."""

from __future__ import annotations

import sys

# --standalone: each launch's rendezvous takes a free port, so two tests launching at
# once (pytest -n) never meet on torchrun's default port 29500.
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
