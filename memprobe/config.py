"""``[tool.memprobe]`` in ``pyproject.toml`` (or any TOML file): the sweep and gate config.

Reading is strict on purpose: the gate guards CI, so a misspelt key or a limit
that is not a size must stop the run (exit 2) rather than quietly check less
than the user meant. Every error names the key and where it sits, e.g.
``tool.memprobe.gate.rules[1]: unknown key 'max_peek'``.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from memprobe.errors import UserError
from memprobe.io.files import read_regular
from memprobe.io.sizes import format_bytes, parse_size
from memprobe.io.text import binary_kind, exception_text, quoted, utf8_text
from memprobe.records import DEVICE_CHOICES, DEVICES, DTYPE_ALIASES, DTYPES, MAX_COUNT, Grid

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

ROOT = "tool.memprobe"
# Sections of [tool.memprobe] that memprobe reads. Anything else is a typo:
# `[tool.memprobe.gat]` must not silently turn the gate off.
SECTIONS = ("sweep", "gate")
FILTER_KEYS = ("tokens", "vocab", "batch", "dtype", "chunk_size", "tp", "cp", "device")
LIMIT_KEYS = ("max_peak", "max_peak_over_floor", "max_big_fp32_blocks")
# A rule's kernel glob: a name or a pattern of a few dozen characters (an import path's
# kernel too), far below this.
MAX_GLOB = 1_000
# Rules one gate config holds at most: a project's are a few dozen.
MAX_RULES = 1_000


@dataclass(frozen=True)
class Rule:
    """One gate rule: which cases it covers (filters) and the limits they must meet.

    A filter left as None matches every value; a tuple matches any of its values.
    """

    where: str  # e.g. "tool.memprobe.gate.rules[0]", for messages
    kernel: str  # fnmatch glob: "local_chunked*"
    tokens: tuple[int, ...] | None = None
    vocab: tuple[int, ...] | None = None
    batch: tuple[int, ...] | None = None
    dtype: tuple[str, ...] | None = None
    chunk_size: tuple[int, ...] | None = None
    tp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    device: tuple[str, ...] | None = None
    max_peak: int | None = None  # bytes
    max_peak_over_floor: float | None = None  # peak_bytes / floor_bytes
    max_big_fp32_blocks: int | None = None  # float32 [B,S,V] blocks live at the peak

    @property
    def name(self) -> str:
        """Short id for output: ``rules[0]``."""
        return self.where.rsplit(".", 1)[-1]

    def filters(self) -> dict[str, tuple[Any, ...]]:
        """The filters this rule sets (kernel excluded: it is a glob)."""
        values = {key: getattr(self, key) for key in FILTER_KEYS}
        return {key: value for key, value in values.items() if value is not None}

    def limits(self) -> dict[str, int | float]:
        values = {key: getattr(self, key) for key in LIMIT_KEYS}
        return {key: value for key, value in values.items() if value is not None}

    def describe(self) -> str:
        """``local_chunked* tokens=20000 vocab=131072``: what the rule selects."""
        parts = [self.kernel]
        for key, values in self.filters().items():
            parts.append(f"{key}={','.join(str(v) for v in values)}")
        return " ".join(parts)


@dataclass(frozen=True)
class GateConfig:
    """``[tool.memprobe.gate]``: rules, and defaults for the baseline flags."""

    rules: tuple[Rule, ...] = ()
    baseline: Path | None = None  # resolved against the config file's folder
    max_regression: float | None = None  # percent


@dataclass(frozen=True)
class MemprobeConfig:
    source: Path | None  # the TOML file read; None when no pyproject.toml was found
    sweep: Grid | None = None
    gate: GateConfig = field(default_factory=GateConfig)


# -- finding and reading ----------------------------------------------------


def find_pyproject(start: Path) -> Path | None:
    """The nearest ``pyproject.toml`` at ``start`` or above, as ruff and black find it."""
    start = start.resolve()
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        # Found if it exists at all: a FIFO or folder of that name is then refused for
        # what it is, not passed over as if there were no pyproject.toml. So is a link
        # that leads nowhere (exists() follows it): passed over, the rules of a
        # pyproject.toml further up, another project's, gated this one.
        if candidate.exists() or candidate.is_symlink():
            return candidate
    return None


# A config is a few KB; the cap only stops a device or a wrong file from being read whole.
MAX_CONFIG_BYTES = 16 * 2**20


def read_toml(path: Path) -> dict[str, Any]:
    if not path.exists() and path.is_symlink():
        raise UserError(
            f"config file {path} is a link to {os.readlink(path)}, which leads to no file "
            "(it is missing, or a loop of links)",
            "point the link at a TOML file, or remove it",
        )
    if not path.exists():
        raise UserError(
            f"config file {path} does not exist", "give --config an existing TOML file"
        ) from None
    data = read_regular(path, what="config file", max_bytes=MAX_CONFIG_BYTES)
    # The file was read: what is wrong is its text, not its path or permissions (the
    # hint these two errors used to give).
    try:
        # Past a byte order mark (Windows editors save one): read as a character of the
        # TOML, it was "Invalid statement (at line 1, column 1)" of a line that looks
        # right, where config.json's is read past.
        return tomllib.loads(utf8_text(data))
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path} is not valid TOML: {exc}", "fix the syntax at that line") from None
    except UnicodeDecodeError as exc:
        kind = binary_kind(data)
        if kind:
            raise UserError(
                f"config {path} is {kind}, not a TOML file",
                "give the pyproject.toml or TOML file with [tool.memprobe]",
            ) from None
        raise UserError(
            f"config {path} is not UTF-8 text (byte {data[exc.start]:#04x} at offset "
            f"{exc.start:,})",
            "TOML is UTF-8: save the file as UTF-8",
        ) from None
    except RecursionError:
        raise UserError(
            f"config {path} nests arrays or tables too deep to read",
            "a memprobe config is a few tables of keys: fix the file",
        ) from None
    except ValueError as exc:
        # tomllib reads an integer with int(), which refuses text past Python's 4,300
        # digits with a plain ValueError (not a TOMLDecodeError): it was a traceback.
        what = (
            "an integer of more than 4,300 digits"
            if "digits" in str(exc)
            else f"a value Python cannot read ({exception_text(exc, name=False)})"
        )
        raise UserError(
            f"config {path} holds {what}",
            "a memprobe config holds sizes and counts of a few digits: fix the file",
        ) from None


def load_config(path: Path | None = None, *, start: Path | None = None) -> MemprobeConfig:
    """Read ``[tool.memprobe]`` from ``path``, or from the nearest pyproject.toml above ``start``.

    A file given explicitly must hold a ``[tool.memprobe]`` table; a pyproject.toml
    found by search may lack one (the result is then an empty config).
    """
    explicit = path is not None
    if path is None:
        path = find_pyproject(start or Path.cwd())
        if path is None:
            return MemprobeConfig(source=None)
    data = read_toml(path)
    tool = data.get("tool", {})
    section = tool.get("memprobe") if isinstance(tool, dict) else None
    if section is None:
        if explicit:
            raise UserError(
                f"{path} has no [{ROOT}] table",
                f"add [{ROOT}.gate] rules (see memprobe gate --help)",
            )
        return MemprobeConfig(source=path)
    try:
        return parse_config(section, source=path)
    except UserError as exc:
        raise UserError(f"{path}: {exc.message}", exc.hint) from None


def parse_config(section: Any, *, source: Path | None = None) -> MemprobeConfig:
    """Validate the ``[tool.memprobe]`` table (already parsed TOML)."""
    table = _table(section, ROOT)
    _no_unknown(table, SECTIONS, ROOT, what="section")
    sweep = _parse_sweep(table["sweep"], f"{ROOT}.sweep") if "sweep" in table else None
    base = source.parent if source is not None else Path.cwd()
    gate = _parse_gate(table["gate"], f"{ROOT}.gate", base) if "gate" in table else GateConfig()
    return MemprobeConfig(source=source, sweep=sweep, gate=gate)


# -- sections ---------------------------------------------------------------

# [tool.memprobe.sweep] takes the grid's fields; lists are literal (no ×2 ladder):
# a gate must run the same cases every time, and the config says exactly which.
_SWEEP_KEYS = tuple(f.name for f in fields(Grid) if f.name != "ladder")


def _parse_sweep(value: Any, where: str) -> Grid:
    table = _table(value, where)
    _no_unknown(table, _SWEEP_KEYS, where)
    for required in ("tokens", "vocab"):
        if required not in table:
            raise UserError(
                f"{where}: missing key '{required}'", f"e.g. {required} = [4096, 20000]"
            )
    kwargs: dict[str, Any] = {
        "ladder": False,
        "tokens": _ints(table["tokens"], where, "tokens"),
        "vocab": _ints(table["vocab"], where, "vocab"),
    }
    for key in ("batch", "chunk_size", "tp", "cp", "hidden"):
        if key in table:
            kwargs[key] = _ints(table[key], where, key)
    if "dtype" in table:
        kwargs["dtype"] = _dtypes(table["dtype"], where)
    if "kernel" in table:
        kwargs["kernel"] = _kernel_names(table["kernel"], where)
    if "device" in table:
        kwargs["device"] = _device(table["device"], where)
    if "grid" in table:
        if not isinstance(table["grid"], bool):
            raise UserError(f"{where}: 'grid' must be true or false, not {quoted(table['grid'])}")
        kwargs["grid"] = table["grid"]
    return Grid(**kwargs)


def _parse_gate(value: Any, where: str, base: Path) -> GateConfig:
    table = _table(value, where)
    _no_unknown(table, ("rules", "baseline", "max_regression"), where)
    raw_rules = table.get("rules", [])
    # Both `rules = [{...}]` and `[[tool.memprobe.gate.rules]]` parse to a list of tables.
    if not isinstance(raw_rules, list):
        raise UserError(
            f"{where}: 'rules' must be a list of tables",
            "write rules = [{ kernel = ..., max_peak = ... }] or [[tool.memprobe.gate.rules]]",
        )
    if len(raw_rules) > MAX_RULES:
        # Each rule is checked, and printed, on every case it matches: 100,000 rules (4 MB
        # of TOML, under the size cap) kept the gate printing for minutes.
        raise UserError(
            f"{where}: {len(raw_rules):,} rules; a gate config holds at most {MAX_RULES:,}",
            "one rule covers many cases: use a kernel glob and filters (tokens, vocab, ...)",
        )
    rules = tuple(_parse_rule(raw, f"{where}.rules[{i}]") for i, raw in enumerate(raw_rules))
    baseline = None
    if "baseline" in table:
        if not isinstance(table["baseline"], str) or not table["baseline"]:
            # An empty string is a string: "must be a path string" said the wrong thing.
            said = "is empty" if table["baseline"] == "" else "must be a path string"
            raise UserError(f"{where}: 'baseline' {said}", "write the baseline's path")
        if "\0" in table["baseline"]:
            # TOML strings may hold "\u0000"; no path can, and the first look at it
            # (os.stat, realpath) raised ValueError: a traceback.
            raise UserError(
                f"{where}: 'baseline' holds a NUL character (\\u0000)",
                "no file name holds one: write the baseline's path",
            )
        # "~/base.json" is the user's home, as a shell reads it: joined as written, it named
        # a folder "~" beside the config, and the line's own hint (`--update-baseline
        # ~/base.json`, expanded by the shell) made a baseline the gate never read.
        baseline = base / Path(table["baseline"]).expanduser()
    max_regression = None
    if "max_regression" in table:
        max_regression = _percent(table["max_regression"], f"{where}.max_regression")
    return GateConfig(rules=rules, baseline=baseline, max_regression=max_regression)


def _parse_rule(value: Any, where: str) -> Rule:
    table = _table(value, where)
    _no_unknown(table, ("kernel", *FILTER_KEYS, *LIMIT_KEYS), where)
    kernel = table.get("kernel")
    if not isinstance(kernel, str) or not kernel:
        if kernel is None:
            said = "missing key 'kernel'"
        else:  # an empty string is a string: "must be a string" said the wrong thing
            said = "'kernel' is empty" if kernel == "" else "'kernel' must be a string"
        raise UserError(
            f"{where}: {said}",
            'name a kernel or a glob, e.g. kernel = "local_chunked*" (or "*" for all)',
        )
    if len(kernel) > MAX_GLOB:
        # fnmatch compiles the glob to a regular expression, a few seconds a megabyte: a
        # config of 16 MiB of globs kept the gate for over a minute before it said a word.
        raise UserError(
            f"{where}: 'kernel' is a glob of {len(kernel):,} characters (at most {MAX_GLOB:,})",
            'name a kernel or a glob, e.g. kernel = "local_chunked*" (or "*" for all)',
        )
    kwargs: dict[str, Any] = {"where": where, "kernel": kernel}
    for key in ("tokens", "vocab", "batch", "chunk_size", "tp", "cp"):
        if key in table:
            kwargs[key] = _ints(table[key], where, key)
    if "dtype" in table:
        kwargs["dtype"] = _dtypes(table["dtype"], where)
    if "device" in table:
        devices = table["device"] if isinstance(table["device"], list) else [table["device"]]
        if not devices:
            raise UserError(f"{where}: 'device' is an empty list", "give at least one value")
        kwargs["device"] = tuple(_device(d, where, allow_auto=False) for d in devices)
    if "max_peak" in table:
        kwargs["max_peak"] = _max_peak(table["max_peak"], where)
    if "max_peak_over_floor" in table:
        ratio = table["max_peak_over_floor"]
        if not _finite_number(ratio) or ratio <= 0:
            raise UserError(
                f"{where}: max_peak_over_floor {quoted(ratio)} is not a positive number",
                "write a ratio such as 1.06 (peak may be 6% above the floor)",
            )
        if ratio < 1:
            # A peak holds its floor (a row whose floor is above its peak is refused), so
            # no case can meet a ratio under 1: written as 0.06 for "6% above", every case
            # failed, after the gate's own sweep had run them all (hours on a GPU).
            raise UserError(
                f"{where}: max_peak_over_floor {quoted(ratio)} is below 1, which no case can "
                "meet (a peak holds its floor: peak / floor is 1 or more)",
                "write the ratio itself, e.g. 1.06 for a peak up to 6% above its floor",
            )
        kwargs["max_peak_over_floor"] = float(ratio)
    if "max_big_fp32_blocks" in table:
        count = table["max_big_fp32_blocks"]
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count < 2**63:
            raise UserError(
                f"{where}: max_big_fp32_blocks {quoted(count, 40)} is not a count",
                "write a whole number of zero or more",
            )
        kwargs["max_big_fp32_blocks"] = count
    rule = Rule(**kwargs)
    if not rule.limits():
        raise UserError(
            f"{where}: rule sets no limit", f"add at least one of {', '.join(LIMIT_KEYS)}"
        )
    return rule


# -- values -----------------------------------------------------------------


# A limit below this written without a unit is surely not what its writer meant:
# `max_peak = 1.5` is 1 byte, and every case "fails" it (the CLI warns alike on --other 58).
PLAUSIBLE_PEAK = 2**20


def _max_peak(value: Any, where: str) -> int:
    size = parse_size(value, what=f"{where}: max_peak")
    unitless = (isinstance(value, (int, float)) and not isinstance(value, bool)) or (
        isinstance(value, str) and re.fullmatch(r"\s*[0-9][0-9_,]*(\.[0-9]+)?\s*", value)
    )
    if unitless and size < PLAUSIBLE_PEAK:
        shown = str(value).strip()
        raise UserError(
            f"{where}: max_peak {shown} has no unit, so it is {format_bytes(size)}",
            f'write the unit, e.g. max_peak = "{shown} GiB" (or "{shown} B" if you mean bytes)',
        )
    return size


def _finite_number(value: Any) -> bool:
    """An int or float that is not a bool, NaN or infinite (TOML has nan and inf)."""
    # An int of 400 digits is finite but no float: math.isfinite would overflow on it.
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) < 2**63
    return isinstance(value, float) and math.isfinite(value)


def _table(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise UserError(f"{where} must be a table, not {type(value).__name__}")
    return value


def _no_unknown(
    table: Mapping[str, Any], known: tuple[str, ...], where: str, what: str = "key"
) -> None:
    for key in table:
        if key not in known:
            raise UserError(
                f"{where}: unknown {what} {quoted(key)}", f"known {what}s: {', '.join(known)}"
            )


def _ints(value: Any, where: str, key: str) -> tuple[int, ...]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise UserError(f"{where}: '{key}' is an empty list", "give at least one value")
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or item <= 0:
            raise UserError(
                f"{where}: '{key}' value {quoted(item)} is not a positive whole number",
                f"e.g. {key} = [4096, 20000]",
            )
        if item > MAX_COUNT:
            # The bound --tokens and every count flag are held to: a config past it ran a
            # sweep of 2^41 tokens the CLI refuses, or one that overflowed int64 in torch.
            shown = f"{item:,}" if item < 10**20 else f"of {len(str(item)):,} digits"
            raise UserError(
                f"{where}: '{key}' value {shown} is beyond the largest count memprobe "
                f"simulates ({MAX_COUNT:,} = 2^40)",
                f"e.g. {key} = [4096, 20000]",
            )
    return tuple(items)


def _dtypes(value: Any, where: str) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for item in items:
        name = DTYPE_ALIASES.get(item, item) if isinstance(item, str) else None
        if name not in DTYPES:
            raise UserError(f"{where}: unknown dtype {quoted(item)}", f"use {', '.join(DTYPES)}")
        out.append(name)
    if not out:
        raise UserError(f"{where}: 'dtype' is an empty list", "give at least one value")
    return tuple(out)


def _kernel_names(value: Any, where: str) -> tuple[str, ...]:
    from memprobe.kernels import KERNELS
    from memprobe.kernels.peers import PEERS
    from memprobe.kernels.user import is_import_path

    items = value if isinstance(value, list) else [value]
    if not items:
        raise UserError(f"{where}: 'kernel' is an empty list", "omit it to run every kernel")
    for item in items:
        if not isinstance(item, str):
            raise UserError(
                f"{where}: unknown kernel {quoted(item)}", f"known: {', '.join(KERNELS)}"
            )
        if is_import_path(item):
            # Your own kernel: imported when a sweep runs it, never when the config is
            # read (`memprobe gate RUN` only reads results; importing would run its code).
            continue
        # A GPU peer is known even where it cannot run: its row says why (skipped).
        elif item not in KERNELS and item not in PEERS:
            known = ", ".join([*KERNELS, *PEERS])
            raise UserError(f"{where}: unknown kernel {quoted(item)}", f"known: {known}")
    return tuple(items)


def _device(value: Any, where: str, *, allow_auto: bool = True) -> str:
    allowed = DEVICE_CHOICES if allow_auto else DEVICES
    if not isinstance(value, str) or value not in allowed:
        raise UserError(f"{where}: unknown device {quoted(value)}", f"use {', '.join(allowed)}")
    return str(value)


def _percent(value: Any, where: str) -> float:
    if not _finite_number(value) or value < 0:
        raise UserError(
            f"{where} {quoted(value)} is not a percentage of zero or more", "e.g. 5 for 5%"
        )
    return float(value)
