"""The one JSON codec of the records: field order, declared key order, and reading back by
the type hints."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import pytest

from memprobe.io.codec import NOT_JSON, from_json, to_json


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Leaf:
    name: str
    line: int


@dataclass(frozen=True)
class Tree:
    size: int
    ratio: float
    leaf: Leaf | None
    leaves: tuple[Leaf, ...]
    pairs: tuple[tuple[str, int], ...]
    triple: tuple[int, int, int] | None
    kind: Literal["a", "b"]
    colour: Colour
    path: Path
    counts: dict[str, int]
    either: int | str | None
    flag: bool = False
    trace: tuple[int, ...] = field(default=(), metadata=NOT_JSON)


@dataclass(frozen=True)
class Ordered:
    JSON_KEYS: ClassVar[tuple[str, ...]] = ("b", "total", "a")

    a: int
    b: int
    hidden: int = 0

    @property
    def total(self) -> int:
        return self.a + self.b


TREE = Tree(
    size=3,
    ratio=0.5,
    leaf=Leaf("f", 1),
    leaves=(Leaf("g", 2), Leaf("h", 3)),
    pairs=(("x", 1), ("y", 2)),
    triple=(1, 2, 3),
    kind="b",
    colour=Colour.BLUE,
    path=Path("/tmp/x.pickle"),
    counts={"p": 1},
    either="s",
    trace=(7, 8),
)


def test_fields_in_order_nested_and_converted() -> None:
    data = to_json(TREE)
    assert list(data) == [
        "size", "ratio", "leaf", "leaves", "pairs", "triple", "kind", "colour", "path",
        "counts", "either", "flag",
    ]  # fmt: skip
    assert data["leaves"] == [{"name": "g", "line": 2}, {"name": "h", "line": 3}]
    assert data["pairs"] == [["x", 1], ["y", 2]]
    assert data["colour"] == "blue" and data["path"] == "/tmp/x.pickle"
    assert "trace" not in data  # NOT_JSON


def test_reads_back_what_it_wrote() -> None:
    back = from_json(Tree, json.loads(json.dumps(to_json(TREE))))
    assert back == Tree(**{**TREE.__dict__, "trace": ()})  # a NOT_JSON field takes its default
    assert isinstance(back.leaves, tuple) and isinstance(back.pairs[0], tuple)
    assert back.colour is Colour.BLUE and back.path == Path("/tmp/x.pickle")
    none = Tree(**{**TREE.__dict__, "leaf": None, "triple": None, "either": None, "trace": ()})
    assert from_json(Tree, to_json(none)) == none


def test_declared_keys_order_a_view_and_read_back() -> None:
    data = to_json(Ordered(1, 2, hidden=5))
    assert list(data.items()) == [("b", 2), ("total", 3), ("a", 1)]
    # The property is ignored on reading, the unwritten field takes its default.
    assert from_json(Ordered, data) == Ordered(1, 2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"size": "3"}, r"Tree\.size: expected int, got str"),
        ({"size": True}, r"Tree\.size: expected int, got bool"),
        ({"leaves": [{"name": "g", "line": None}]}, r"Tree\.leaves\[0\]\.line: expected int"),
        ({"triple": [1, 2]}, r"Tree\.triple: expected 3 items, got 2"),
        ({"kind": "c"}, r"Tree\.kind: expected one of \('a', 'b'\)"),
        ({"either": 1.5}, r"Tree\.either: expected"),
        ({"counts": {"p": "1"}}, r"Tree\.counts\['p'\]: expected int"),
    ],
)
def test_a_wrong_value_names_where_it_is(change: dict[str, object], message: str) -> None:
    data = {**to_json(TREE), **change}
    with pytest.raises(ValueError, match=message):
        from_json(Tree, data)


def test_a_missing_field_without_default_is_named() -> None:
    data = to_json(TREE)
    del data["size"], data["flag"]  # flag has a default: not missing
    with pytest.raises(ValueError, match=r"Tree: missing size$"):
        from_json(Tree, data)


def test_an_int_reads_as_a_float() -> None:
    assert from_json(Tree, {**to_json(TREE), "ratio": 1}).ratio == 1
