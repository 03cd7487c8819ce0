"""User modules that end the process while they are imported (``sys.exit`` at module
level) are one line naming the module, for a kernel and for a step alike: memprobe had
exited with the module's own status and printed nothing."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from memprobe.errors import UserError
from memprobe.kernels.user import resolve_user_kernel
from memprobe.profile import load_step

BODIES = [
    ("sys.exit(3)", "import sys\nsys.exit(3)\n", "SystemExit: 3"),
    ("sys.exit(0)", "import sys\nsys.exit(0)\n", "SystemExit: 0"),
    ("sys.exit('text')", "import sys\nsys.exit('bye')\n", "SystemExit: bye"),
    ("raise SystemExit", "raise SystemExit\n", "SystemExit"),
    ("exit() from a nested import", "import hostile_exit_helper\n", "SystemExit: 4"),
]


@pytest.mark.parametrize(("what", "body", "words"), BODIES, ids=[b[0] for b in BODIES])
@pytest.mark.parametrize("load", [resolve_user_kernel, load_step], ids=["kernel", "step"])
def test_a_module_that_exits_on_import_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str, body: str, words: str, load: Any
) -> None:
    name = f"hostile_exit_{abs(hash((what, load.__name__)))}"
    (tmp_path / f"{name}.py").write_text(body)
    (tmp_path / "hostile_exit_helper.py").write_text("import sys\nsys.exit(4)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in (name, "hostile_exit_helper"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(UserError) as info:
        load(f"{name}:fn")
    line = info.value.one_line()
    assert f"importing {name!r} failed" in line and words in line and "\n" not in line
