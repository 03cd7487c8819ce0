"""[tool.memprobe] parsing: both rule forms, strictness, and where errors point."""

from __future__ import annotations

from pathlib import Path

import pytest

from memprobe.config import GateConfig, Rule, find_pyproject, load_config
from memprobe.errors import UserError

INLINE = """
[tool.memprobe.sweep]
tokens = [4096, 20000]
vocab = 131072
dtype = ["bfloat16", "fp32"]
kernel = ["unchunked", "local_chunked"]

[tool.memprobe.gate]
rules = [
  { kernel = "local_chunked", tokens = 20000, vocab = 131072, max_peak = "10.3 GiB" },
  { kernel = "local_chunked*", max_peak_over_floor = 1.06, max_big_fp32_blocks = 0 },
]
"""

TABLES = """
[tool.memprobe.sweep]
tokens = [4096, 20000]
vocab = 131072
dtype = ["bfloat16", "fp32"]
kernel = ["unchunked", "local_chunked"]

[[tool.memprobe.gate.rules]]
kernel = "local_chunked"
tokens = 20000
vocab = 131072
max_peak = "10.3 GiB"

[[tool.memprobe.gate.rules]]
kernel = "local_chunked*"
max_peak_over_floor = 1.06
max_big_fp32_blocks = 0
"""


def write(tmp_path: Path, text: str, name: str = "pyproject.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(UserError) as info:
        load_config(write(tmp_path, text))
    return info.value.one_line()


def test_inline_rules_and_rule_tables_are_the_same(tmp_path: Path) -> None:
    a = load_config(write(tmp_path, INLINE, "a.toml"))
    b = load_config(write(tmp_path, TABLES, "b.toml"))
    assert a.gate == b.gate
    assert a.sweep == b.sweep
    first, second = a.gate.rules
    assert first == Rule(
        where="tool.memprobe.gate.rules[0]",
        kernel="local_chunked",
        tokens=(20000,),
        vocab=(131072,),
        max_peak=int(10.3 * 2**30),
    )
    assert second.limits() == {"max_peak_over_floor": 1.06, "max_big_fp32_blocks": 0}
    assert second.describe() == "local_chunked*"
    assert first.describe() == "local_chunked tokens=20000 vocab=131072"


def test_sweep_section_is_typed_and_literal(tmp_path: Path) -> None:
    sweep = load_config(write(tmp_path, INLINE)).sweep
    assert sweep is not None
    assert sweep.tokens == (4096, 20000) and sweep.vocab == (131072,)
    assert sweep.dtype == ("bf16", "fp32")  # aliases normalised
    assert sweep.ladder is False and sweep.device == "auto" and sweep.batch == (1,)


def test_pyproject_is_found_from_a_subfolder(tmp_path: Path) -> None:
    write(tmp_path, INLINE)
    deep = tmp_path / "src" / "pkg"
    deep.mkdir(parents=True)
    assert find_pyproject(deep) == (tmp_path / "pyproject.toml").resolve()
    cfg = load_config(start=deep)
    assert len(cfg.gate.rules) == 2


def test_pyproject_without_memprobe_table_is_an_empty_config(tmp_path: Path) -> None:
    write(tmp_path, "[project]\nname = 'x'\n")
    cfg = load_config(start=tmp_path)
    assert cfg.source == (tmp_path / "pyproject.toml").resolve()
    assert cfg.sweep is None and cfg.gate == GateConfig()


def test_explicit_file_must_hold_the_table(tmp_path: Path) -> None:
    message = load_error(tmp_path, "[tool.other]\nx = 1\n")
    assert "has no [tool.memprobe] table" in message


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        load_config(tmp_path / "nope.toml")


def test_unreadable_toml_names_the_file(tmp_path: Path) -> None:
    message = load_error(tmp_path, "[tool.memprobe.gate\nrules = [")
    assert "pyproject.toml is not valid TOML" in message and "line 1" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '[tool.memprobe.gate]\nrules = [{ kernel = "a" , max_peak = "1 GiB" },'
            ' { kernel = "b", max_peek = "1 GiB" }]',
            "tool.memprobe.gate.rules[1]: unknown key 'max_peek'",
        ),
        (
            '[[tool.memprobe.gate.rules]]\nkernel = "a"\nmax_peak = 1\ntoken = 5',
            "tool.memprobe.gate.rules[0]: unknown key 'token'",
        ),
        ("[tool.memprobe.gate]\nrule = []", "tool.memprobe.gate: unknown key 'rule'"),
        ("[tool.memprobe.gat]\nrules = []", "tool.memprobe: unknown section 'gat'"),
        ("[tool.memprobe.sweep]\ntokens = [1]\nvocab = [2]\ngird = true", "unknown key 'gird'"),
    ],
)
def test_unknown_keys_say_which_and_where(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in load_error(tmp_path, text)


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ('{ kernel = "a", max_peak = "ten GiB" }', "rules[0]: max_peak 'ten GiB' is not a size"),
        ('{ kernel = "a", max_peak = "10 GiBs" }', "is not a size"),
        ('{ kernel = "a", max_peak = -1 }', "is negative"),
        ('{ kernel = "a", max_peak = true }', "is not a size"),
        ('{ kernel = "a", max_peak_over_floor = "1.06" }', "is not a positive number"),
        ('{ kernel = "a", max_big_fp32_blocks = -1 }', "is not a count"),
        ('{ kernel = "a" }', "rules[0]: rule sets no limit"),
        ('{ max_peak = "1 GiB" }', "rules[0]: missing key 'kernel'"),
        ('{ kernel = "a", tokens = 0, max_peak = 1 }', "'tokens' value 0 is not a positive"),
        ('{ kernel = "a", dtype = "fp8", max_peak = 1 }', "unknown dtype 'fp8'"),
        ('{ kernel = "a", device = "tpu", max_peak = 1 }', "unknown device 'tpu'"),
        ('{ kernel = "a", device = "auto", max_peak = 1 }', "unknown device 'auto'"),
    ],
)
def test_bad_rules(tmp_path: Path, rule: str, expected: str) -> None:
    assert expected in load_error(tmp_path, f"[tool.memprobe.gate]\nrules = [{rule}]\n")


def test_sizes_in_every_spelling(tmp_path: Path) -> None:
    text = (
        "[tool.memprobe.gate]\nrules = ["
        '{ kernel = "a", max_peak = "11000 MB" }, { kernel = "a", max_peak = 2000000 },'
        '{ kernel = "a", max_peak = "5.4GiB" }]\n'
    )
    peaks = [r.max_peak for r in load_config(write(tmp_path, text)).gate.rules]
    assert peaks == [11_000_000_000, 2_000_000, int(5.4 * 2**30)]


def test_rules_must_be_a_list(tmp_path: Path) -> None:
    message = load_error(tmp_path, '[tool.memprobe.gate.rules]\nkernel = "a"\n')
    assert "'rules' must be a list of tables" in message


def test_sweep_needs_tokens_and_known_kernels(tmp_path: Path) -> None:
    assert "missing key 'tokens'" in load_error(tmp_path, "[tool.memprobe.sweep]\nvocab = [8]\n")
    bad = '[tool.memprobe.sweep]\ntokens = [8]\nvocab = [8]\nkernel = ["local_chunkd"]\n'
    assert "unknown kernel 'local_chunkd'" in load_error(tmp_path, bad)


def test_a_gpu_peer_is_a_known_kernel_in_the_sweep_config(tmp_path: Path) -> None:
    # Known even without CUDA or the package: the sweep makes it a skipped row with the reason.
    text = '[tool.memprobe.sweep]\ntokens = [8]\nvocab = [8]\nkernel = ["liger_cross_entropy"]\n'
    assert load_config(write(tmp_path, text)).sweep is not None


def test_gate_defaults_for_baseline_flags(tmp_path: Path) -> None:
    text = '[tool.memprobe.gate]\nbaseline = "ci/baseline.json"\nmax_regression = 2.5\n'
    gate = load_config(write(tmp_path, text)).gate
    assert gate.baseline == tmp_path / "ci" / "baseline.json"  # relative to the config
    assert gate.max_regression == 2.5
    assert "is not a percentage" in load_error(
        tmp_path, "[tool.memprobe.gate]\nmax_regression = -1"
    )
