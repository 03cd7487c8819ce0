"""How memprobe's ``--help`` names things, for every command in one place.

typer 0.29 prints a flag's type as ``<bool>`` (a flag takes no value: the word only
reads as one it would) and writes a required argument in the usage line as its raw
parameter name in braces (``memprobe diff [OPTIONS] {a} {b}``). memprobe's commands
and its root instead show flags bare, and arguments by their metavar, in upper case
when none is given, optional ones in brackets, as click always wrote them
(``memprobe diff [OPTIONS] A.pickle B.pickle``).
"""

from __future__ import annotations

from typing import Any

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


class Command(_Named, TyperCommand):
    """A memprobe command: flags without a type, arguments by their metavar."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return _usage(self, ctx)


class Group(_Named, TyperGroup):
    """memprobe itself (``memprobe --help``): its flags without a type too."""
