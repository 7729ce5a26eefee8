"""ddl.base.atomic_write: a file is replaced whole or not at all, by every writer that uses it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ddl.base.atomic_write import atomic_open, atomic_path, temporary_beside, write_atomically


class Boom(RuntimeError):
    pass


def test_a_write_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "state.bin"
    target.write_bytes(b"old")
    write_atomically(target, b"new bytes")
    assert target.read_bytes() == b"new bytes"
    write_atomically(target, "text too")
    assert target.read_text() == "text too"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.bin"]


@pytest.mark.parametrize("durable", [False, True])
def test_a_writer_that_fails_leaves_the_old_file_whole_and_no_temporary(tmp_path: Path, durable: bool) -> None:
    target = tmp_path / "model.bin"
    target.write_bytes(b"old and whole")
    with pytest.raises(Boom), atomic_open(target, durable=durable) as f:
        f.write(b"half of the n")
        f.flush()
        assert temporary_beside(target).read_bytes() == b"half of the n"  # written beside, not over
        assert target.read_bytes() == b"old and whole"
        raise Boom
    assert target.read_bytes() == b"old and whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.bin"]


def test_a_path_writer_a_named_temporary_and_a_custom_put(tmp_path: Path) -> None:
    target = tmp_path / "lib.so"
    moved: list[tuple[str, str]] = []

    def put(tmp: Path, dst: Path) -> None:
        moved.append((tmp.name, dst.name))
        os.replace(tmp, dst)

    with atomic_path(target, temporary=tmp_path / ".lib.1234.so", put=put, durable=True) as tmp:
        assert tmp == tmp_path / ".lib.1234.so" and not tmp.exists()
        tmp.write_bytes(b"\x7fELF")  # a compiler writes it by its name
    assert moved == [(".lib.1234.so", "lib.so")]
    assert target.read_bytes() == b"\x7fELF"
    with pytest.raises(Boom), atomic_path(target, temporary=tmp_path / ".lib.1234.so", put=put) as tmp:
        tmp.write_bytes(b"broken")
        raise Boom
    assert len(moved) == 1 and target.read_bytes() == b"\x7fELF" and not tmp.exists()


def test_a_reserved_size_that_was_too_large_leaves_no_tail(tmp_path: Path) -> None:
    target = tmp_path / "weights.caffemodel"
    with atomic_open(target, size=1 << 16) as f:
        f.write(b"0123456789")
    assert target.read_bytes() == b"0123456789"


def test_only_new_files_are_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mode 'wb' or 'w'"), atomic_open(tmp_path / "x", "ab"):
        pass


def test_every_writer_of_whole_files_uses_the_one_helper() -> None:
    """No other module renames a temporary file over its target (the pattern written four
    times before issue 42): a new writer should use ddl.base.atomic_write."""
    root = Path(__file__).resolve().parents[2]
    found = []
    for folder in ("core", "adapters"):
        for path in (root / folder).rglob("*.py"):
            if path.name == "atomic_write.py":
                continue
            text = path.read_text()
            for pattern in ("os.replace(", ".replace(tmp", "tmp.rename(", "tmp.replace(", "mkstemp("):
                if pattern in text:
                    found.append(f"{path.relative_to(root)}: {pattern}")
    allowed = {"adapters/caffe_compat/formats/whole_file.py: tmp.rename(",  # swap_in's own put (renameat2)
               "adapters/caffe_compat/formats/whole_file.py: tmp.replace(",
               "adapters/tensorflow/status_op.py: mkstemp("}  # only a unique name for atomic_path
    assert sorted(set(found) - allowed) == []
