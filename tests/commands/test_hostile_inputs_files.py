"""Hostile files, table-driven: pickles that crash the C unpickler, and files that are not
regular files (a device, a FIFO) given where memprobe reads. Each is one line, exit 2."""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memprobe.snapshot.nesting import MAX_TUPLE_NESTING, count_wrapping_tuples

# -- nested tuples: hashed as a dict key, they overflow the C stack (a segfault) ----


def _nested_tuple_key(depth: int, *, memo: bool = False, wrap: bytes = b"") -> bytes:
    """{((((),),),...): None}, built by opcodes (pickle.dumps itself would recurse)."""
    level = b"\x85\x94" if memo else b"\x85"
    return b"\x80\x04}" + wrap + b")" + level * depth + b"Ns."


def _nested_tuple_in_set(depth: int) -> bytes:
    return b"\x80\x04\x8f(" + b")" + b"\x85" * depth + b"\x90."


def _nested_pairs(depth: int) -> bytes:  # (((0, x), x), x): TUPLE2 wrapping a tuple
    return b"\x80\x04}" + b"K\x00K\x00\x86" + b"K\x01\x86" * depth + b"Ns."


def _nested_via_mark(depth: int) -> bytes:  # protocol 0/1 style: MARK ... TUPLE
    return b"}" + b"(" * depth + b"t" * depth + b"Ns."


def _nested_via_memo(depth: int) -> bytes:  # each level put in the memo and read back
    body = b")q\x00" + b"".join(b"h\x00\x85q\x00" for _ in range(depth))
    return b"\x80\x02}" + body + b"Ns."


CRASHERS = {
    "tuple key": _nested_tuple_key(1_000_000),
    "tuple key, memoized levels": _nested_tuple_key(300_000, memo=True),
    "tuple key under a real-looking prefix": _nested_tuple_key(
        300_000, wrap=b"\x8c\x08segments\x94]\x94s"
    ),
    "tuple in a set": _nested_tuple_in_set(400_000),
    "pairs wrapping pairs": _nested_pairs(300_000),
    "MARK ... TUPLE": _nested_via_mark(300_000),
    "memo read back": _nested_via_memo(300_000),
}


@pytest.mark.parametrize("name", sorted(CRASHERS))
def test_deeply_nested_tuples_are_refused_before_unpickling(
    run_cli, tmp_path: Path, name: str
) -> None:
    path = tmp_path / "nested.pickle"
    path.write_bytes(CRASHERS[name])
    for args in (["attribute", str(path)], ["diff", str(path), str(path)]):
        code, out, err = run_cli(*args)
        assert code == 2 and not out, (name, args)
        assert "nested that deep they would crash the unpickler" in err
        assert len(err.strip().splitlines()) == 1


def test_the_crash_is_real_without_the_check(tmp_path: Path) -> None:
    """What the check prevents: the C unpickler dies of SIGSEGV, printing nothing."""
    path = tmp_path / "nested.pickle"
    path.write_bytes(_nested_tuple_key(400_000))
    code = f"import pickle; pickle.loads(open({str(path)!r}, 'rb').read())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert done.returncode == -11 and not done.stdout


def _real_style(n: int) -> dict:
    """What torch writes: pool ids as (int, int) tuples, on every segment and entry."""
    frames = [{"name": f"f{i}", "filename": "x.py", "line": i} for i in range(4)]
    trace = [
        {"action": "alloc", "addr": 0x7F00_0000_0000 + 512 * i, "size": 512, "stream": 0,
         "pool_id": (0, i % 3), "frames": frames, "time_us": 2**33 + i}
        for i in range(n)
    ]  # fmt: skip
    block = {"size": 512, "state": "active_allocated"}
    segment = {"address": 0x7F00_0000_0000, "total_size": 2 << 20, "segment_pool_id": (0, 0),
               "blocks": [block], "frames": frames}  # fmt: skip
    # Three segments, each its own address range (one listed thrice would overlap itself).
    segments = [{**segment, "address": segment["address"] + (k << 21)} for k in range(3)]
    return {"segments": segments, "device_traces": [trace],
            "allocator_settings": {"max_split_size": -1, "pools": [(1, 2), (3, 4.5)]},
            # numbers-only tuples as keys, each value's number followed by the next key's
            "pool_sizes": {(i, i % 7): i for i in range(n)}}  # fmt: skip


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_real_tuples_are_not_counted(tmp_path: Path, protocol: int) -> None:
    from memprobe.snapshot.load import load_snapshot

    data = pickle.dumps(_real_style(3 * MAX_TUPLE_NESTING), protocol=protocol)
    assert count_wrapping_tuples(data)[0] == 0
    path = tmp_path / "real.pickle"
    path.write_bytes(data)
    assert len(load_snapshot(path)["device_traces"][0]) == 3 * MAX_TUPLE_NESTING


def _random_plain(rnd: random.Random, depth: int = 0) -> object:
    r = rnd.random()
    if depth > 4 or r < 0.4:
        return rnd.choice([0, -1, 255, 65536, 2**31, 2**63, 2**80, 2**700, 1.5, None, True,
                           "", "x" * 70, "y" * 300, "t\x85\x86)", b"\x85", "é",
                           rnd.randrange(-(2**40), 2**40)])  # fmt: skip
    if r < 0.6:
        return [_random_plain(rnd, depth + 1) for _ in range(rnd.randrange(5))]
    if r < 0.8:
        return {str(rnd.randrange(9)): _random_plain(rnd, depth + 1) for _ in range(3)}
    if r < 0.9:
        return tuple(_random_plain(rnd, depth + 1) for _ in range(rnd.randrange(5)))
    return tuple(rnd.choice([0, 7, 2**40, None, 1.0]) for _ in range(rnd.randrange(5)))


@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5])
def test_the_scan_reads_opcodes_exactly_as_the_unpickler(protocol: int) -> None:
    """Every stop lands on pickletools' STOP, and no tuple opcode is missed."""
    rnd = random.Random(protocol)
    for _ in range(150):
        value = _random_plain(rnd)
        data = pickle.dumps([value, value, {"k": value}], protocol=protocol)
        ops = list(pickletools.genops(data))
        tuples = sum(op.name.startswith("TUPLE") for op, _, _ in ops)
        wrapping, stop = count_wrapping_tuples(data, limit=10**9)
        assert stop == ops[-1][2] and wrapping <= tuples


# -- special files: refused by what fstat says, before a byte is read --------------


def _special(tmp_path: Path, kind: str) -> Path:
    if kind == "dev-zero":
        return Path("/dev/zero")
    path = tmp_path / f"{kind}.x"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    return path


@pytest.fixture
def run_dir(made_run: Path, tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)  # no pyproject.toml here: the gate reads only what is given
    return Path(shutil.copytree(made_run, tmp_path / "run"))


SPECIAL_USES = {
    "snapshot": lambda s, run: ["attribute", str(s)],
    "diff's second snapshot": lambda s, run: ["diff", str(run / "snapshots" / _one(run)), str(s)],
    "results": lambda s, run: ["gate", str(s), "--baseline", str(run)],
    "baseline": lambda s, run: ["gate", str(run), "--baseline", str(s)],
    "--from-run": lambda s, run: [
        "plan",
        "--vocab",
        "1024",
        "--budget",
        "1GiB",
        "--from-run",
        str(s),
    ],  # fmt: skip
    "--config": lambda s, run: ["gate", str(run), "--config", str(s)],
}


def _one(run: Path) -> str:
    return next(p.name for p in (run / "snapshots").iterdir())


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
@pytest.mark.parametrize("use", sorted(SPECIAL_USES))
def test_special_files_are_refused_in_one_line(
    run_cli, run_dir: Path, tmp_path: Path, use: str, kind: str
) -> None:
    run = run_dir
    special = _special(tmp_path, kind)
    code, out, err = run_cli(*SPECIAL_USES[use](special, run))
    assert code == 2, (use, err)
    assert "not a regular file" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
@pytest.mark.parametrize("name", ["run.json", "results.json"])
def test_a_run_directory_holding_special_files(
    run_cli, run_dir: Path, tmp_path: Path, kind: str, name: str
) -> None:
    run = run_dir
    (run / name).unlink()
    special = _special(tmp_path, kind)
    if kind == "fifo":
        os.mkfifo(run / name)
    else:
        (run / name).symlink_to(special)
    uses = [["report", str(run)], ["sweep", "--resume", str(run)]]
    if name == "results.json":
        uses.append(["gate", str(run), "--baseline", str(run)])
    for args in uses:
        code, _, err = run_cli(*args)
        assert code == 2 and "not a regular file" in err, (args, err)


def test_a_baseline_in_the_config_that_is_a_device(run_cli, run_dir: Path, tmp_path: Path) -> None:
    run = run_dir
    (tmp_path / "pyproject.toml").write_text(
        '[tool.memprobe.gate]\nbaseline = "/dev/zero"\n'
        'rules = [{ kernel = "*", max_peak = "1GiB" }]\n'
    )
    code, _, err = run_cli("gate", str(run))
    assert code == 2 and "/dev/zero is a character device, not a regular file" in err


def test_a_small_file_is_read_by_its_size(tmp_path: Path) -> None:
    """Under a 1 GiB address-space limit a small snapshot still loads (no 2 GiB buffer)."""
    from memprobe.snapshot import write_snapshot

    path = write_snapshot({"segments": [], "device_traces": [[]]}, tmp_path / "s.pickle")
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
        f"from memprobe.snapshot.load import load_snapshot; load_snapshot({str(path)!r}); "
        "print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr[-500:]


# -- snapshot contents: numbers past 64 bits, negative totals, deep settings, bombs --


def _tampered(tmp_path: Path, change) -> Path:
    import copy

    import snapshot_fixtures as fx

    snap = copy.deepcopy(fx.real_style_snapshot())
    change(snap)
    path = tmp_path / "tampered.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=4))
    return path


def _deep(levels: int) -> list:
    x: list = []
    for _ in range(levels):
        x = [x]
    return x


def _every_entry(key: str, value: object):
    return lambda s: [e.__setitem__(key, value) for e in s["device_traces"][0]]


TAMPERED = {
    "size of 5,000 digits": (_every_entry("size", 10**5000), "valid 'size'"),
    "size 2^64": (_every_entry("size", 2**64), "valid 'size'"),
    "addr of 5,000 digits": (_every_entry("addr", -(10**5000)), "valid 'addr'"),
    "total_size of 5,000 digits": (
        lambda s: s["segments"][0].__setitem__("total_size", 10**5000), None),
    "negative total_size": (
        lambda s: s["segments"][0].__setitem__("total_size", -5), "negative 'total_size'"),
    "block size 2^70": (
        lambda s: s["segments"][0]["blocks"][0].__setitem__("size", 2**70), "valid 'size'"),
    "settings nested 5,000 deep": (
        lambda s: s.__setitem__("allocator_settings", {"max_split_size": _deep(5000)}),
        "nest more than"),
    "settings nested 6 deep": (
        lambda s: s.__setitem__("allocator_settings", {"x": {"y": _deep(5)}}), "nest more than"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(TAMPERED))
def test_tampered_snapshot_contents_are_one_line(run_cli, tmp_path: Path, name: str) -> None:
    change, expected = TAMPERED[name]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 12000))  # to pickle the deep one
    path = _tampered(tmp_path, change)
    for args in (["attribute", str(path)], ["attribute", str(path), "--replay"]):
        code, out, err = run_cli(*args)
        assert code in (0, 2) and "Traceback" not in err, (args, err)
        if expected:
            assert code == 2 and expected in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("value", "kept"),
    [(10**30, False), (2**63, True), (-1, True), (1.5e300, False), (float("nan"), False)],
)
def test_times_outside_64_bits_are_dropped(value: object, kept: bool) -> None:
    from memprobe.snapshot.load import normalize_snapshot

    entry = {"action": "alloc", "addr": 1, "size": 512, "stream": 0, "time_us": value}
    snap = normalize_snapshot({"segments": [], "device_traces": [[entry]]})
    assert ("time_us" in snap["device_traces"][0][0]) is kept


def _bombs() -> dict[str, dict]:
    from memprobe.snapshot.load import MAX_ENTRIES, MAX_FRAMES

    seg = {"address": 0, "total_size": 512, "blocks": [{"size": 512, "state": "inactive"}]}
    frames = [{"name": "f", "filename": "x.py", "line": 1}] * 50_000
    per = MAX_FRAMES // len(frames) + 1
    entry = {"action": "alloc", "addr": 1, "size": 512, "stream": 0, "frames": []}
    return {
        "segments referenced": {"segments": [seg] * (MAX_ENTRIES // 2 + 1), "device_traces": []},
        "entries referenced": {"segments": [], "device_traces": [[entry] * (MAX_ENTRIES + 1)]},
        "blocks share frames": {
            "segments": [{"address": 0, "total_size": 512 * per, "blocks": [
                {"size": 512, "state": "active_allocated", "frames": frames}] * per}],
            "device_traces": []},
        "segments share frames": {
            "segments": [{"address": 0, "total_size": 0, "frames": frames, "blocks": []}] * per,
            "device_traces": []},
    }  # fmt: skip


@pytest.mark.parametrize("name", ["segments referenced", "entries referenced",
                                  "blocks share frames", "segments share frames"])  # fmt: skip
def test_shared_references_are_counted_before_expansion(tmp_path: Path, name: str) -> None:
    from memprobe.errors import UserError
    from memprobe.snapshot.load import load_snapshot

    path = tmp_path / "bomb.pickle"
    path.write_bytes(pickle.dumps(_bombs()[name], protocol=4))
    assert path.stat().st_size < 30_000_000
    with pytest.raises(UserError, match="beyond the"):
        load_snapshot(path)


@pytest.mark.parametrize("text", ["1x²x4", "1x٣x4", "1x" + "9" * 400, "1x-4", "x", "1xx4"])
def test_shape_labels_read_only_ascii_digits(text: str) -> None:
    from memprobe.snapshot.labels import parse_shape

    assert parse_shape(text) is None


# -- run directories and sizes: tampered numbers, sizes past 8 EiB ---------------------

RUN_TAMPERS = {
    "results: error 1e308": ("results.json", "rows", "max_abs_err_fwd", 1e308, "out of range"),
    "results: time of 400 digits": ("results.json", "rows", "fwd_time_s", 10**400, "out of range"),
    "run.json: tokens 'big'": ("run.json", "cases", "tokens", "big", "not a whole number"),
    "run.json: tokens 2.5": ("run.json", "cases", "tokens", 2.5, "not a whole number"),
    "run.json: tokens -4": ("run.json", "cases", "tokens", -4, "out of range"),
    "run.json: kernel 5": ("run.json", "cases", "kernel", 5, "is not text"),
    "run.json: dtype int8": ("run.json", "cases", "dtype", "int8", "dtype 'int8'"),
    "run.json: unknown key": ("run.json", "cases", "colour", "red", "does not write: 'colour'"),
}


@pytest.mark.parametrize("name", sorted(RUN_TAMPERS))
def test_tampered_run_directories_are_one_line(run_cli, run_dir: Path, name: str) -> None:
    file, table, key, value, expected = RUN_TAMPERS[name]
    data = json.loads((run_dir / file).read_text())
    for item in data[table]:
        item[key] = value
    (run_dir / file).write_text(json.dumps(data))
    args = ["sweep", "--resume", str(run_dir)] if file == "run.json" else ["report", str(run_dir)]
    code, out, err = run_cli(*args)
    assert code == 2 and expected in err, err
    assert len(err.strip().splitlines()) == 1 and not out


@pytest.mark.parametrize(
    "args",
    [
        ["sweep", "--tokens", "64", "--vocab", "128", "--budget", "9" * 400],
        ["plan", "--vocab", "128", "--budget", "9" * 400],
        ["plan", "--vocab", "128", "--budget", "80GiB", "--other", "9" * 400 + "GiB"],
        ["sweep", "--tokens", "9" * 400, "--vocab", "128"],
        ["sweep", "--tokens", str(2**40 + 1), "--vocab", "128"],
        ["plan", "--vocab", "128", "--budget", "80GiB", "--tp", str(2**41)],
    ],
)
def test_sizes_past_any_gpu_are_one_line(run_cli, args: list[str]) -> None:
    code, out, err = run_cli(*args)
    assert code == 2 and "beyond the largest" in err, err
    assert len(err.strip().splitlines()) == 1


def test_a_400_digit_max_peak_in_the_config(tmp_path: Path) -> None:
    from memprobe.config import load_config
    from memprobe.errors import UserError

    path = tmp_path / "pyproject.toml"
    path.write_text(f'[tool.memprobe.gate]\nrules = [{{ kernel = "x", max_peak = {"9" * 400} }}]\n')
    with pytest.raises(UserError, match="beyond the largest size"):
        load_config(path)


@pytest.mark.parametrize(
    ("blocks", "expected"),
    [
        ([{"address": 0, "size": 512, "state": "inactive"},
          {"address": 256, "size": 512, "state": "active_allocated"}], "overlaps the block before"),
        ([{"address": 0, "size": 4096, "state": "active_allocated"}], "past its end"),
        ([], "has no blocks"),
    ],
)  # fmt: skip
def test_blocks_that_overlap_or_leave_their_segment(run_cli, tmp_path: Path, blocks, expected):
    seg = {"address": 0, "total_size": 1024, "blocks": blocks}
    path = tmp_path / "seg.pickle"
    path.write_bytes(pickle.dumps({"segments": [seg], "device_traces": [[]]}, protocol=4))
    code, _, err = run_cli("attribute", str(path), "--replay")
    assert code == 2 and expected in err


@pytest.mark.parametrize("key", ["max_peak_over_floor", "max_big_fp32_blocks"])
def test_a_400_digit_limit_of_any_kind(tmp_path: Path, key: str) -> None:
    from memprobe.config import load_config
    from memprobe.errors import UserError

    path = tmp_path / "pyproject.toml"
    path.write_text(f'[tool.memprobe.gate]\nrules = [{{ kernel = "x", {key} = {"9" * 400} }}]\n')
    with pytest.raises(UserError):
        load_config(path)
