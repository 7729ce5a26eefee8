"""ddl.checkpoint's format in one process: round trips, atomic commits under SIGKILL, refusals that name the file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from ddl.checkpoint import Checkpoint, CheckpointError, Tensor, read_manifest, save
from ddl.checkpoint.manifest import decode_value, encode_value
from ddl.tools import checkpoint as cli


def arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"model/w": rng.standard_normal((3, 5)).astype(np.float32), "model/b": rng.standard_normal(5),
            "model/steps": np.array(seed, np.int64), "model/mask": rng.random(7) > 0.5,
            "optimizer/state/w/exp_avg": rng.standard_normal((3, 5)).astype(np.float16)}


def save_arrays(folder: Path, seed: int, extra: dict | None = None) -> None:
    save(folder, {k: Tensor.of(a) for k, a in arrays(seed).items()},
         {"optimizer/state/w/step": seed, "optimizer/state/w/momentum": None},
         framework="numpy", meta={"model": {"keys": ["w", "b"]}}, extra=extra or {"seed": seed})


def loaded(folder: Path) -> dict[str, np.ndarray]:
    ckpt = Checkpoint.open(folder)
    return {k: ckpt.reader.array(k) for k in arrays(0)}


def test_a_save_reads_back_bit_for_bit(tmp_path: Path) -> None:
    save_arrays(tmp_path / "c", 1, {"epoch": 3, "betas": (0.9, 0.99), "lr": float("inf")})
    got = loaded(tmp_path / "c")
    for k, a in arrays(1).items():
        assert got[k].dtype == a.dtype and got[k].shape == a.shape, k
        np.testing.assert_array_equal(got[k], a)
    m = read_manifest(tmp_path / "c")
    assert m.framework == "numpy" and m.world_size == 1
    assert m.extra == {"epoch": 3, "betas": (0.9, 0.99), "lr": float("inf")}
    assert m.entries["optimizer/state/w/step"].value == 1 and m.entries["optimizer/state/w/momentum"].value is None
    assert sorted(f.name.split("-")[0] for f in m.files.values()) == ["model", "optimizer"]
    for e in m.entries.values():
        assert e.inline or e.offset % 64 == 0  # every tensor aligned in its file


def test_values_keep_tuples_and_non_finite_floats() -> None:
    value = {"betas": (0.9, 0.999), "eps": float("-inf"), "nested": [{"tuple": 1}], "n": np.float32(2.5)}
    assert decode_value(json.loads(json.dumps(encode_value(value)))) == {**value, "n": 2.5}
    with pytest.raises(TypeError, match=r"extra\['f'\]"):
        encode_value({"f": object()}, "extra")


def test_a_new_save_replaces_the_old_one_and_removes_its_files(tmp_path: Path) -> None:
    save_arrays(tmp_path, 1)
    first = set(os.listdir(tmp_path))
    save_arrays(tmp_path, 2)
    np.testing.assert_array_equal(loaded(tmp_path)["model/w"], arrays(2)["model/w"])
    now = set(os.listdir(tmp_path))
    assert not (first - {"manifest.json"}) & now, "the first save's files are left"
    assert len(now) == 3


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_flipped_byte_is_refused_naming_the_file(tmp_path: Path) -> None:
    save_arrays(tmp_path, 1)
    m = read_manifest(tmp_path)
    name = next(f for f in m.files if f.startswith("optimizer"))
    _flip(tmp_path / name, 3)
    ckpt = Checkpoint.open(tmp_path)
    ckpt.reader.array("model/w")  # the other file is fine
    with pytest.raises(CheckpointError, match=rf"{name}: corrupt: its sha256 .* files\['{name}'\]\.sha256"):
        ckpt.reader.array("optimizer/state/w/exp_avg")


def test_a_truncated_or_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    save_arrays(tmp_path, 1)
    names = sorted(read_manifest(tmp_path).files)
    (tmp_path / names[0]).write_bytes((tmp_path / names[0]).read_bytes()[:-1])
    with pytest.raises(CheckpointError, match=rf"{names[0]}: \d+ bytes, .*nbytes"):
        Checkpoint.open(tmp_path).reader.verify(names[0])
    (tmp_path / names[1]).unlink()
    with pytest.raises(CheckpointError, match=rf"{names[1]}: missing"):
        Checkpoint.open(tmp_path).reader.verify(names[1])


def test_a_damaged_manifest_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no ddl checkpoint at"):
        Checkpoint.open(tmp_path)
    save_arrays(tmp_path, 1)
    raw = json.loads((tmp_path / "manifest.json").read_text())
    del raw["entries"]["model/w"]["shape"]
    (tmp_path / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"field entries\['model/w'\] is missing or malformed"):
        Checkpoint.open(tmp_path)
    raw["version"] = 99
    (tmp_path / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="field 'version' is 99"):
        Checkpoint.open(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="manifest.json: not a readable manifest"):
        Checkpoint.open(tmp_path)
    with pytest.raises(CheckpointError, match="field 'framework' is 'numpy'"):
        save_arrays(tmp_path, 1)
        Checkpoint.open(tmp_path, framework="torch")


# -- a process killed while it saves ---------------------------------------------------------
_CHILD = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import ddl.checkpoint.collective as collective
    import ddl.checkpoint.files as files
    from ddl.checkpoint import Tensor, save

    folder, phase, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    die = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    if phase == "data":  # half of the first data file on disk
        real = collective.write_data_file
        def half(folder_, name, rank, tensors):
            with open(folder_ / name, "wb") as f:
                f.write(b"x" * 100)
            die()
        collective.write_data_file = half
    elif phase == "commit":  # every data file and the temporary manifest written, not renamed
        files.os.replace = die
    elif phase == "cleanup":  # committed, the old files not yet removed
        collective.remove_stale = die
    rng = np.random.default_rng(seed)
    size = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    while True:
        save(folder, {"model/w": Tensor.of(np.full(size, seed, np.float32)),
                      "optimizer/state/w/m": Tensor.of(rng.standard_normal(size).astype(np.float32))},
             {}, framework="numpy", meta={}, extra={"seed": seed})
        if phase != "loop":
            break
        seed += 1
""")


def _child(tmp_path: Path, phase: str, seed: int, *extra: str) -> subprocess.Popen[bytes]:
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    return subprocess.Popen([sys.executable, str(script), str(tmp_path / "ckpt"), phase, str(seed), *extra])


@pytest.mark.parametrize("phase, survivor", [("data", 1), ("commit", 1), ("cleanup", 2)])
def test_a_save_killed_at_any_phase_leaves_a_whole_checkpoint(tmp_path: Path, phase: str, survivor: int) -> None:
    first = _child(tmp_path, "none", 1)
    assert first.wait(60) == 0
    killed = _child(tmp_path, phase, 2)
    assert killed.wait(60) == -signal.SIGKILL
    ckpt = Checkpoint.open(tmp_path / "ckpt")
    for name in ckpt.manifest.files:
        ckpt.reader.verify(name)
    assert ckpt.manifest.extra == {"seed": survivor}
    assert float(ckpt.reader.array("model/w")[0]) == survivor
    assert len(os.listdir(tmp_path / "ckpt")) > 3  # the killed save's leftovers ...
    again = _child(tmp_path, "none", 3)
    assert again.wait(60) == 0
    assert len(os.listdir(tmp_path / "ckpt")) == 3  # ... go with the next save


def test_sigkill_from_outside_in_the_middle_of_saves_leaves_the_last_commit_loadable(tmp_path: Path) -> None:
    assert _child(tmp_path, "none", 1).wait(60) == 0
    for wait_s in (0.8, 1.3):
        child = _child(tmp_path, "loop", 100, str(2_000_000))  # 8 MB a tensor, saved over and over
        time.sleep(wait_s)
        child.send_signal(signal.SIGKILL)
        assert child.wait(60) == -signal.SIGKILL
        ckpt = Checkpoint.open(tmp_path / "ckpt")
        for name in ckpt.manifest.files:
            ckpt.reader.verify(name)
        seed = ckpt.manifest.extra["seed"]
        assert seed == 1 or seed >= 100
        assert float(ckpt.reader.array("model/w")[-1]) == seed


# -- the command -------------------------------------------------------------------------------
def test_inspect_lists_and_verifies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_arrays(tmp_path, 1)
    assert cli.main(["inspect", str(tmp_path), "--verify", "--tensors", "--json", str(tmp_path / "i.json")]) == 0
    out = capsys.readouterr().out
    assert "numpy, saved by 1 rank(s)" in out and "verified" in out and "model/w  float32[3, 5]" in out
    assert json.loads((tmp_path / "i.json").read_text())["sections"]["model"]["tensors"] == 4
    name = next(iter(read_manifest(tmp_path).files))
    _flip(tmp_path / name, 0)
    assert cli.main(["inspect", str(tmp_path), "--verify"]) == 1
    assert f"{name}: corrupt" in capsys.readouterr().err


def test_consolidate_writes_npz_and_names_unknown_kinds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_arrays(tmp_path / "c", 1)
    assert cli.main(["consolidate", str(tmp_path / "c"), "-o", str(tmp_path / "m.npz"),
                     "--optimizer", str(tmp_path / "o.npz")]) == 0
    with np.load(tmp_path / "m.npz") as z:
        np.testing.assert_array_equal(z["w"], arrays(1)["model/w"])
    with np.load(tmp_path / "o.npz") as z:
        assert float(z["state/w/step"]) == 1.0
    assert cli.main(["consolidate", str(tmp_path / "c"), "-o", str(tmp_path / "m.bin")]) == 2
    assert "no writer for this kind of file" in capsys.readouterr().err
