"""How memprobe's ``--help`` names things, for every command in one place.

typer 0.29 prints a flag's type as ``<bool>`` (a flag takes no value: the word only
reads as one it would) and writes a required argument in the usage line as its raw
parameter name in braces (``memprobe diff [OPTIONS] {a} {b}``). memprobe's commands
and its root instead show flags bare, and arguments by their metavar, in upper case
when none is given, optional ones in brackets, as click always wrote them
(``memprobe diff [OPTIONS] A.pickle B.pickle``).
"""

from __future__ import annotations

import os
from typing import Any

from typer import BadParameter, TyperException
from typer.core import TyperCommand, TyperGroup


def _name_params(params: list[Any]) -> None:
    for param in params:
        if param.param_type_name == "argument":
            if param.metavar is None:
                param.metavar = (param.name or "").upper()
        elif getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""  # shown as nothing rather than <bool>


def _usage(command: Any, ctx: Any) -> list[str]:
    pieces = [command.options_metavar] if command.options_metavar else []
    for param in command.get_params(ctx):
        if param.param_type_name != "argument":
            continue
        name = param.metavar + ("..." if param.nargs != 1 else "")
        pieces.append(name if param.required else f"[{name}]")
    return pieces


class _Named:
    """Flags without a type, arguments by their metavar (mixed into a click command)."""

    params: list[Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _name_params(self.params)

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            _name_params([option])
        return option


# Options that name a file or folder whatever their type (a few take text: a list of
# snapshots, a page or a folder).
PATH_OPTIONS = frozenset(("--out", "--from-run", "--other-from", "--html"))


def _names_a_path(param: Any) -> bool:
    bare = getattr(param, "bare_type", None)
    return (callable(bare) and bare() == "Path") or bool(PATH_OPTIONS & set(param.opts))


# The options that write one file, per command, and a name to show in the example: a
# folder spelled as one ("out/") names no file for them (sweep's and plan's --out name
# folders; report's --out takes either and says so itself).
FILE_OUTPUTS = {
    "gate": {"--junit-xml": "junit.xml", "--update-baseline": "baseline.json"},
    "attribute": {"--html": "attribute.html"},
    "profile": {"--out": "step.pickle", "--html": "step.html"},
    "step": {"--out": "step.pickle"},
}


def _spells_a_folder(value: str) -> bool:
    """``out/`` or ``out/.``: what pathlib reads as ``out`` (a file of that name)."""
    return value.endswith(("/", os.sep, "/.", f"{os.sep}."))


class Command(_Named, TyperCommand):
    """A memprobe command: flags without a type, arguments by their metavar."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return _usage(self, ctx)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            # The values as given, before any type reads them: each check below looks at
            # what the user typed.
            raw, _, _ = self.make_parser(ctx).parse_args(args=list(args))
        except Exception:
            raw = None  # not parsable: click's own parse says what is wrong
        if raw is not None:
            self._refuse_options_taken_as_values(ctx, raw)
            self._refuse_blank_paths(ctx, raw)
            self._refuse_standard_streams(ctx, raw)
            self._refuse_unexpanded_home(ctx, raw)
            self._refuse_folder_spellings(ctx, raw)
        try:
            return list(super().parse_args(ctx, args))
        except TyperException as exc:
            # click's parser raises some usage errors (an option given last without its
            # value, a value given to a flag) with no command attached, and the line's hint
            # then named `memprobe --help`, whose page lists none of this command's options.
            if hasattr(exc, "ctx") and exc.ctx is None:
                exc.ctx = ctx
            raise

    def _refuse_options_taken_as_values(self, ctx: Any, raw: dict[str, Any]) -> None:
        """An option given without its value takes the next word as it, even an option:
        `step --out --json` wrote its snapshot to a file named '--json' (which `rm --json`
        cannot remove) and printed text, `sweep --out --json` made a run directory of that
        name, `sweep --kernel --tokens 64` said "unexpected extra argument (64)". A value
        that spells one of the command's own options is that option, not a value."""
        spelled = {o for p in self.get_params(ctx) for o in [*p.opts, *p.secondary_opts]}
        for param in self.params:
            if param.param_type_name != "option" or getattr(param, "is_flag", False):
                continue
            value = raw.get(param.name)
            values = value if isinstance(value, (list, tuple)) else [value]
            taken = next(
                (v for v in values if isinstance(v, str) and v.split("=", 1)[0] in spelled),
                None,
            )
            if taken is None:
                continue
            flag = max(param.opts, key=len)
            raise BadParameter(
                f"no value given: the next option, {taken}, was read as the value "
                f"(give {flag} its value before the next option)",
                ctx=ctx,
                param=param,
            )

    def _refuse_folder_spellings(self, ctx: Any, raw: dict[str, Any]) -> None:
        """A file output spelled as a folder (``--junit-xml reports/``): typer's Path drops
        the trailing slash, so the file was written under the folder's own name, a file
        ``reports`` where a folder was meant (and where the next command then finds a file)."""
        outputs = FILE_OUTPUTS.get(self.name or "", {})
        if not outputs:
            return
        for param in self.params:
            flag = next((o for o in param.opts if o in outputs), None)
            value = raw.get(param.name)
            if flag is None or not isinstance(value, str) or not _spells_a_folder(value):
                continue
            raise BadParameter(
                f"{value!r} names a folder, and {flag} writes a file "
                f"(name the file, e.g. {flag} {os.path.join(value, outputs[flag])})",
                ctx=ctx,
                param=param,
            )

    def _refuse_blank_paths(self, ctx: Any, raw: dict[str, Any]) -> None:
        """A file or folder given as '' or ' ' (an unset shell variable, quoted) names
        none: typer read it as the current directory ('.'), or as not given at all."""
        for param in self.params:
            value = raw.get(param.name)
            values = value if isinstance(value, (list, tuple)) else [value]
            if any(isinstance(v, str) and not v.strip() for v in values) and _names_a_path(param):
                shown = next(v for v in values if isinstance(v, str) and not v.strip())
                raise BadParameter(
                    f"{shown!r} names no file or folder (give a path)", ctx=ctx, param=param
                )

    def _refuse_standard_streams(self, ctx: Any, raw: dict[str, Any]) -> None:
        """A path given as '-', many tools' name for standard input or output: memprobe
        reads and writes files by name, so `--junit-xml -` wrote a file named '-' in the
        current directory ("wrote -"), and `--config -` read one (or said no such file)
        while standard input went unread. ``./-`` still names a file of that name."""
        for param in self.params:
            items = _path_items(raw.get(param.name))
            if "-" in items and _names_a_path(param):
                raise BadParameter(
                    "'-' is not standard input or output here: memprobe reads and writes "
                    "files by name (give a path, or ./- for a file named '-')",
                    ctx=ctx,
                    param=param,
                )

    def _refuse_unexpanded_home(self, ctx: Any, raw: dict[str, Any]) -> None:
        """A path starting with '~' that the shell left as it is (quoted, after a comma in
        --other-from's list): memprobe took it as written, so `--out '~/runs'` made a folder named
        '~' in the current directory (which an `rm -rf ~` then meant to clear up), and
        `attribute '~/step.pickle'` said there was no such file. ``./~`` still names one."""
        for param in self.params:
            items = _path_items(raw.get(param.name))
            home = next((i for i in items if i.startswith("~")), None)
            if home is None or not _names_a_path(param):
                continue
            expanded = os.path.expanduser(home)
            meant = f"write {expanded}" if expanded != home else "give the folder in full"
            raise BadParameter(
                f"{home!r} starts with '~', which the shell did not expand (quoted, or after "
                f"a comma): {meant}, or ./{home} for a path named so",
                ctx=ctx,
                param=param,
            )


def _path_items(value: Any) -> list[str]:
    """The paths a raw option value names: itself, each of a repeated option's values, and
    each item of a comma list (--other-from takes a list of snapshots), stripped."""
    values = value if isinstance(value, (list, tuple)) else [value]
    return [i.strip() for v in values if isinstance(v, str) for i in v.split(",")]


class Group(_Named, TyperGroup):
    """memprobe itself (``memprobe --help``): its flags without a type too."""
