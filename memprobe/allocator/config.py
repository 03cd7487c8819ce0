"""``PYTORCH_ALLOC_CONF`` settings: parse ``key:value,key:value`` text into an :class:`AllocConf`.

The grammar and the checks follow torch's own parser (``c10/core/AllocatorConfig.cpp`` and
``c10/cuda/CUDAAllocatorConfig.cpp``): the text is cut into tokens at ``,`` ``:`` ``[`` ``]``,
spaces are dropped, and each option is ``name:value``. ``roundup_power2_divisions`` also takes
the bracket list ``[256:1,512:2,>:4]``: sizes are grouped into 16 power-of-two intervals
starting at 1 MiB (the key is the interval's lower end in MiB), and ``>`` covers every
interval above the last one named.

Options that change nothing the model simulates (pinned-memory and lock settings) are kept,
so :meth:`AllocConf.to_string` gives the text back, but they do not affect the model.
``backend:cudaMallocAsync`` is recognised and reported as not modelled: that backend hands
memory to the CUDA driver's own pool allocator, whose rules are not public.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass

from memprobe.errors import UserError

MIB = 1 << 20
# torch: sizes are grouped into 16 power-of-two intervals from 1 MiB to 64 GiB.
ROUNDUP_INTERVALS = 16
ROUNDUP_FIRST_LOG2 = 20  # the first interval starts at 2**20 bytes (1 MiB)
# torch: max_split_size_mb and max_non_split_rounding_mb may not go below kLargeBuffer (20 MiB).
MIN_SPLIT_MB = 20
DEFAULT_NON_SPLIT_ROUNDING_MB = 20
DEFAULT_LARGE_SEGMENT_MB = 20

# torch (c10 AcceleratorAllocatorConfig::instance and CUDAAllocatorConfig::instance, 2.13)
# reads the first of these that is set, even to "" (then its defaults), for the shared
# settings and the CUDA-specific ones alike: the older name first, the other never merged.
ENV_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
NATIVE = "native"
MALLOC_ASYNC = "cudaMallocAsync"
_BOOL_OPTIONS = (
    "expandable_segments",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_background_threads",
    "graph_capture_record_stream_reuse",
)
# Accepted and carried through to_string(), with no effect on reserved memory.
_UNMODELLED = (
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_background_threads",
    "pinned_num_register_threads",
    "graph_capture_record_stream_reuse",
)
KNOWN_OPTIONS = (
    "backend",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "roundup_power2_divisions",
    "garbage_collection_threshold",
    "expandable_segments",
    "large_segment_size_mb",
    "per_process_memory_fraction",
    *_UNMODELLED,
)
_HINT = "write options as key:value,key:value, e.g. expandable_segments:True,max_split_size_mb:512"


@dataclass(frozen=True, slots=True)
class AllocConf:
    """The caching allocator's settings, as the model uses them.

    ``roundup_power2_divisions`` holds one entry per size interval (16 of them, the first for
    sizes below 2 MiB, then one per power of two up to 64 GiB); 0 or 1 means "round to 512 B".
    """

    backend: str = NATIVE
    max_split_size_mb: int | None = None  # None: no limit (torch's SIZE_MAX)
    max_non_split_rounding_mb: int = DEFAULT_NON_SPLIT_ROUNDING_MB
    roundup_power2_divisions: tuple[int, ...] = (0,) * ROUNDUP_INTERVALS
    garbage_collection_threshold: float = 0.0  # 0: off
    expandable_segments: bool = False
    large_segment_size_mb: int = DEFAULT_LARGE_SEGMENT_MB
    per_process_memory_fraction: float = 1.0
    unmodelled: tuple[tuple[str, str], ...] = ()  # options kept only for to_string()

    @property
    def is_modelled(self) -> bool:
        return self.backend == NATIVE

    @property
    def max_split_size(self) -> int | None:
        return None if self.max_split_size_mb is None else self.max_split_size_mb * MIB

    @property
    def max_non_split_rounding(self) -> int:
        return self.max_non_split_rounding_mb * MIB

    @property
    def large_segment_size(self) -> int:
        return self.large_segment_size_mb * MIB

    def divisions_for(self, size: int) -> int:
        """torch's ``roundup_power2_divisions(size)``: the divisions of ``size``'s interval."""
        index = max(size.bit_length() - 1 - ROUNDUP_FIRST_LOG2, 0)
        return self.roundup_power2_divisions[min(index, ROUNDUP_INTERVALS - 1)]

    def to_string(self) -> str:
        """The ``PYTORCH_ALLOC_CONF`` text for these settings; ``parse_alloc_conf`` reads it back
        to an equal AllocConf. Defaults are left out, so the default settings give ``""``."""
        parts: list[str] = []
        if self.backend != NATIVE:
            parts.append(f"backend:{self.backend}")
        if self.max_split_size_mb is not None:
            parts.append(f"max_split_size_mb:{self.max_split_size_mb}")
        if self.max_non_split_rounding_mb != DEFAULT_NON_SPLIT_ROUNDING_MB:
            parts.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding_mb}")
        if any(self.roundup_power2_divisions):
            parts.append(
                f"roundup_power2_divisions:{_divisions_text(self.roundup_power2_divisions)}"
            )
        if self.garbage_collection_threshold:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold!r}")
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        if self.large_segment_size_mb != DEFAULT_LARGE_SEGMENT_MB:
            parts.append(f"large_segment_size_mb:{self.large_segment_size_mb}")
        if self.per_process_memory_fraction != 1.0:
            parts.append(f"per_process_memory_fraction:{self.per_process_memory_fraction!r}")
        parts.extend(f"{k}:{v}" for k, v in self.unmodelled)
        return ",".join(parts)


def _divisions_text(table: tuple[int, ...]) -> str:
    if len(set(table)) == 1:
        return str(table[0])
    # The bracket form names single intervals, except that its first entry also fills every
    # interval below it and ">" fills every interval after the last one named.
    tail = len(table) - 1
    while tail > 0 and table[tail - 1] == table[-1]:
        tail -= 1
    first = 0
    while first + 1 < tail and table[first + 1] == table[0]:
        first += 1
    items = [f"{1 << first}:{table[0]}"]
    for i in range(first + 1, tail):
        if table[i] != 0 or i == tail - 1:
            items.append(f"{1 << i}:{table[i]}")
    items.append(f">:{table[-1]}")
    return "[" + ",".join(items) + "]"


def _lex(text: str) -> list[str]:
    tokens: list[str] = []
    buf: list[str] = []
    for ch in text:
        if ch in ",:[]":
            if buf:
                tokens.append("".join(buf))
                buf.clear()
            tokens.append(ch)
        elif ch != " ":
            buf.append(ch)
    if buf:
        tokens.append("".join(buf))
    return tokens


class _Tokens:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _lex(text)
        self.i = 0

    def error(self, problem: str, hint: str = _HINT) -> UserError:
        return UserError(f"allocator settings {self.text!r}: {problem}", hint)

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, what: str) -> str:
        tok = self.peek()
        if tok is None or tok in ",:[]":
            raise self.error(f"expected {what}, found {tok or 'the end'}")
        self.i += 1
        return tok

    def expect(self, ch: str, after: str) -> None:
        if self.peek() != ch:
            raise self.error(f"expected '{ch}' after {after}, found {self.peek() or 'the end'}")
        self.i += 1


# torch reads these settings into 64-bit integers (sizes in MB are multiplied by 2^20).
_MAX_SETTING = 2**43


def _ascii_number(tokens: _Tokens, key: str, value: str) -> None:
    """torch's parser reads the digits 0-9 only; Python's int() and float() any script's
    (``max_split_size_mb:٢٠٠`` was modelled as 200 MB, which torch refuses). As
    memprobe.io.text.foreign_digit says it, here where the model imports only itself."""
    digit = next((c for c in value if c.isdecimal() and not c.isascii()), None)
    if digit:
        named = f"{digit!r} (U+{ord(digit):04X} {unicodedata.name(digit, 'a digit')})"
        raise tokens.error(f"{key} {value!r} is written with {named}, not the digits 0-9")


def _int(tokens: _Tokens, key: str, value: str) -> int:
    shown = value if len(value) <= 24 else f"a number of {len(value)} digits"
    _ascii_number(tokens, key, value)
    try:
        number = int(value) if len(value) <= 64 else None
    except ValueError:
        raise tokens.error(f"{key} needs a whole number, not {shown!r}") from None
    if number is None or abs(number) > _MAX_SETTING:
        raise tokens.error(f"{key} {shown} is beyond what the allocator reads (at most 2^43)")
    return number


def _float(tokens: _Tokens, key: str, value: str) -> float:
    _ascii_number(tokens, key, value)
    try:
        return float(value)
    except ValueError:
        raise tokens.error(f"{key} needs a number, not {value!r}") from None


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _parse_divisions(tokens: _Tokens) -> tuple[int, ...]:
    key = "roundup_power2_divisions"
    if tokens.peek() != "[":
        value = _int(tokens, key, tokens.take(f"a value for {key}"))
        if not _is_power_of_two(value):
            raise tokens.error(f"{key} must be a power of 2, not {value}")
        return (value,) * ROUNDUP_INTERVALS
    tokens.i += 1
    table = [0] * ROUNDUP_INTERVALS
    first = True
    last_index = 0
    while tokens.peek() not in ("]", None):
        interval = tokens.take(f"an interval (MiB) in {key}")
        tokens.expect(":", f"{interval!r} in {key}")
        value = _int(tokens, key, tokens.take(f"divisions for {interval!r}"))
        if value != 0 and not _is_power_of_two(value):
            raise tokens.error(f"{key} divisions must be a power of 2 or 0, not {value}")
        if interval == ">":
            for j in range(last_index + 1, ROUNDUP_INTERVALS):
                table[j] = value
        else:
            mib = _int(tokens, key, interval)
            if not _is_power_of_two(mib):
                raise tokens.error(f"{key} intervals must be powers of 2 (MiB), not {mib}")
            index = min(mib.bit_length() - 1, ROUNDUP_INTERVALS - 1)
            if first:
                for j in range(index):
                    table[j] = value
                first = False
            table[index] = value
            last_index = index
        if tokens.peek() == ",":
            tokens.i += 1
    if tokens.peek() != "]":
        raise tokens.error(f"{key} list has no closing ']'")
    tokens.i += 1
    return tuple(table)


def parse_alloc_conf(text: str | None) -> AllocConf:
    """Parse ``PYTORCH_ALLOC_CONF`` text (``None`` or ``""``: torch's defaults).

    Raises :class:`UserError` with a hint for an unknown option or a bad value, as torch
    would refuse it at startup.
    """
    if not text or not text.strip():
        return AllocConf()
    tokens = _Tokens(text)
    fields: dict[str, object] = {}
    unmodelled: list[tuple[str, str]] = []
    while tokens.peek() is not None:
        key = tokens.take("an option name")
        if key == "release_lock_on_hipmalloc":
            key = "release_lock_on_cudamalloc"
        if key not in KNOWN_OPTIONS:
            raise tokens.error(
                f"unknown option {key!r}", "known options: " + ", ".join(KNOWN_OPTIONS)
            )
        tokens.expect(":", repr(key))
        if key == "roundup_power2_divisions":
            fields[key] = _parse_divisions(tokens)
        else:
            value = tokens.take(f"a value for {key}")
            if key in _BOOL_OPTIONS and value not in ("True", "False"):
                raise tokens.error(f"{key} takes True or False, not {value!r}")
            if key == "backend":
                if value not in (NATIVE, MALLOC_ASYNC):
                    raise tokens.error(
                        f"unknown backend {value!r}", f"use {NATIVE} or {MALLOC_ASYNC}"
                    )
                fields[key] = value
            elif key in ("max_split_size_mb", "max_non_split_rounding_mb"):
                mb = _int(tokens, key, value)
                if mb < MIN_SPLIT_MB:
                    raise tokens.error(f"{key} is {mb}; torch requires at least {MIN_SPLIT_MB}")
                fields[key] = mb
            elif key == "large_segment_size_mb":
                mb = _int(tokens, key, value)
                if mb <= 0:
                    raise tokens.error(f"{key} must be positive, not {mb}")
                fields[key] = mb
            elif key == "garbage_collection_threshold":
                threshold = _float(tokens, key, value)
                if not 0.0 < threshold < 1.0:
                    raise tokens.error(f"{key} must lie strictly between 0 and 1, not {value}")
                fields[key] = threshold
            elif key == "per_process_memory_fraction":
                fraction = _float(tokens, key, value)
                if not 0.0 <= fraction <= 1.0:
                    raise tokens.error(f"{key} must lie in [0, 1], not {value}")
                fields[key] = fraction
            elif key == "expandable_segments":
                fields[key] = value == "True"
            else:
                unmodelled.append((key, value))
        if tokens.peek() is not None:
            tokens.expect(",", f"the value of {key}")
            if tokens.peek() is None:
                raise tokens.error("ends with a stray ','")
    return AllocConf(**fields, unmodelled=tuple(unmodelled))  # type: ignore[arg-type]


def modelled_alloc_conf(text: str, source: str | None = None) -> AllocConf:
    """``--alloc-conf`` text for memprobe's allocator model (sweep, plan, step, profile,
    attribute --replay): parsed, and refused when it names another backend. The model is
    torch's native caching allocator: under ``backend:cudaMallocAsync`` its reserved peak
    would be the native figure printed as that backend's. ``source``: where the text
    came from, as a refusal names it (an environment variable; the flag by default)."""
    try:
        conf = parse_alloc_conf(text)
    except UserError as exc:
        if source is None:
            raise
        raise UserError(f"{source} in the environment: {exc.message}", exc.hint) from None
    if not conf.is_modelled:
        where = f"--alloc-conf {text}" if source is None else f"{source}={text} in the environment"
        raise UserError(
            f"{where}: memprobe models torch's native caching allocator "
            f"only, not backend:{conf.backend}",
            "drop the backend option: the model's figures are the native allocator's"
            if source is None
            else f"unset {source}, or give --alloc-conf with the settings to model",
        )
    return conf


def alloc_conf_setting(
    flag: str | None, environ: Mapping[str, str] | None = None
) -> tuple[str, str | None] | None:
    """The allocator settings memprobe models, as text, and the environment variable they
    came from: ``--alloc-conf`` (from no variable), else those torch reads at startup
    (``PYTORCH_CUDA_ALLOC_CONF``, else ``PYTORCH_ALLOC_CONF``), as the job's own allocator
    would. None when neither is set (torch's defaults). Every command that models reserved
    memory reads them so: sweep did, while plan, step and profile on meta modelled the
    defaults and said "with default settings" under a variable that set others."""
    if flag is not None:
        return flag, None
    _refuse_uncached(environ)
    found = _env_setting(environ)
    return None if found is None else (found[1], found[0])


# torch's switch that turns the caching allocator off (every free goes back to the driver).
NO_CACHING_VAR = "PYTORCH_NO_CUDA_MEMORY_CACHING"


def _refuse_uncached(environ: Mapping[str, str] | None) -> None:
    """The settings are the environment's, as the job's allocator takes them, and the
    environment turns caching off: on meta and cpu the reserved figures were still the
    caching allocator's ("reserved 2.00 MiB ... with default settings", and a plan's
    reserved answer), an allocator the job will not have. The cuda backend refuses it too."""
    env = os.environ if environ is None else environ
    value = env.get(NO_CACHING_VAR, "0")
    if value in ("", "0"):
        return
    raise UserError(
        f"{NO_CACHING_VAR}={value} in the environment turns torch's caching allocator off, "
        "whose reserved memory memprobe models on meta and cpu and reads on cuda",
        f"unset {NO_CACHING_VAR}; on meta and cpu, --alloc-conf models the settings it gives",
    )


def alloc_conf_to_model(
    flag: str | None, environ: Mapping[str, str] | None = None
) -> AllocConf | None:
    """:func:`alloc_conf_setting`, parsed and checked (:func:`modelled_alloc_conf`); on
    cuda the process's own allocator has the environment's, so a run records them and the
    model applies them on meta too. None for torch's defaults."""
    setting = alloc_conf_setting(flag, environ)
    return None if setting is None else modelled_alloc_conf(*setting)


def settings_words(setting: tuple[str, str | None] | None) -> str:
    """How output names the settings modelled: "default settings", the text, and where it
    came from when that is the environment."""
    text, source = ("", None) if setting is None else setting
    words = "default settings" if not text.strip() else text
    if source is None:
        return words
    return f"{words}, from {source}{_unread_note(source)}"


def set_process_alloc_conf(text: str) -> None:
    """Give this process's allocator ``text`` (read at its first CUDA allocation): under
    every name of :data:`ENV_VARS`, since torch reads only the first one set (2.13:
    ``PYTORCH_CUDA_ALLOC_CONF``), and setting ``PYTORCH_ALLOC_CONF`` alone left a user's
    ``PYTORCH_CUDA_ALLOC_CONF`` the one the real allocator ran under."""
    for name in ENV_VARS:
        os.environ[name] = text


def _unread_note(source: str, environ: Mapping[str, str] | None = None) -> str:
    """Both variables set to different text: torch reads only ``source`` (no merge), which
    a user who set the other one last would not expect, so the words say so."""
    env = os.environ if environ is None else environ
    other = next((n for n in ENV_VARS if n != source and n in env), None)
    if other is None or env[other] == env.get(source):
        return ""
    return f" (torch reads it before {other}, also set, and ignores {other})"


def alloc_conf_from_env(environ: Mapping[str, str] | None = None) -> AllocConf:
    """The settings torch would read at startup: ``PYTORCH_CUDA_ALLOC_CONF``, else
    ``PYTORCH_ALLOC_CONF`` (:data:`ENV_VARS`)."""
    found = _env_setting(environ)
    return AllocConf() if found is None else parse_alloc_conf(found[1])


def _env_setting(environ: Mapping[str, str] | None) -> tuple[str, str] | None:
    """The variable torch reads its settings from, and its text: the first of
    :data:`ENV_VARS` set (``os.environ`` when ``environ`` is None)."""
    env = os.environ if environ is None else environ
    name = next((n for n in ENV_VARS if n in env), None)
    return None if name is None else (name, env[name])


def refuse_fraction_under_budget(setting: tuple[str, str | None] | None, budget: int) -> None:
    """``per_process_memory_fraction`` below 1 (``--alloc-conf`` or the environment) beside a
    budget: torch lets the process reserve only that share of the GPU, while every budget
    check judged the whole budget, so `step --budget 3MiB` with a fraction of 0.5 said
    "fits (reserved 2.00 MiB)" of a job the allocator stops at 1.5 MiB (and at a fraction
    of 0, at nothing). The share is the budget to give."""
    if setting is None:
        return
    text, source = setting
    fraction = modelled_alloc_conf(text, source).per_process_memory_fraction
    if fraction >= 1.0:
        return
    from memprobe.io.sizes import format_bytes

    where = "--alloc-conf" if source is None else source
    share = int(fraction * budget)
    raise UserError(
        f"per_process_memory_fraction:{fraction:g} ({where}) lets the process reserve "
        f"{format_bytes(share)} of the {format_bytes(budget)} budget, and the budget checks "
        "judge the whole budget",
        f"give --budget {share}B, the share, and drop per_process_memory_fraction"
        if share > 0
        else "a process that may reserve nothing fits nothing: drop per_process_memory_fraction",
    )
