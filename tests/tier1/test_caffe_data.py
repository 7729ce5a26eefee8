"""ddl.caffe data: LMDB Datum (raw and encoded, BGR), transforms, sharding, HDF5Data and DummyData."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lmdb")
h5py = pytest.importorskip("h5py")
Image = pytest.importorskip("PIL.Image")

from ddl.caffe.data import convert  # noqa: E402
from ddl.caffe.data.database import LEVELDB, LMDB, DatumReader, backend_of  # noqa: E402
from ddl.caffe.formats import blobs, protofile, schema  # noqa: E402
from ddl.caffe.formats.errors import CaffeFormatError  # noqa: E402
from ddl.caffe.net.net import Net  # noqa: E402


def _net(text: str, phase: int = schema.TEST, rank: int = 0, size: int = 1) -> Net:
    return Net(protofile.parse_text(text, schema.NetParameter()), phase, rank=rank, size=size, quiet=True)


def test_encoded_image_list_decodes_to_bgr_and_crops_centre_in_test(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (3, 6, 7, 3)).astype(np.uint8)        # HWC, RGB
    lines = []
    for i, im in enumerate(imgs):
        Image.fromarray(im).save(tmp_path / f"im{i}.png")
        lines.append(f"im{i}.png {i}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    for encoded in (True, False):
        db = tmp_path / f"db{int(encoded)}"
        assert convert.from_image_list(db, tmp_path / "list.txt", tmp_path, encoded=encoded) == 3
        mean = tmp_path / "mean.binaryproto"
        m = np.full((3, 6, 7), 10.0, np.float32)
        protofile.write_binary(mean, blobs.from_array(m[None]))
        net = _net(f'layer {{ name: "d" type: "Data" top: "x" top: "y" transform_param {{ crop_size: 4 mean_file: "{mean}" scale: 0.5 }} '
                   f'data_param {{ source: "{db}" batch_size: 3 backend: LMDB }} }}')
        _, out = net.forward()
        bgr = imgs[:, :, :, ::-1].transpose(0, 3, 1, 2).astype(np.float32)
        want = (bgr[:, :, 1:5, 1:5] - 10.0) * 0.5                          # centre crop of 6x7: offsets (1, 1)
        np.testing.assert_array_equal(out["x"].numpy(), want)
        assert out["y"].tolist() == [0.0, 1.0, 2.0]


def test_train_ranks_read_disjoint_records_and_wrap(tmp_path: Path) -> None:
    x = np.arange(6, dtype=np.uint8).reshape(6, 1, 1, 1)
    convert.from_arrays(tmp_path / "db", x, np.arange(6))
    text = f'layer {{ name: "d" type: "Data" top: "x" top: "y" data_param {{ source: "{tmp_path / "db"}" batch_size: 2 backend: LMDB }} }}'
    seen = {r: [_net(text, schema.TRAIN, r, 2).forward()[1]["y"].tolist()] for r in (0, 1)}
    assert seen == {0: [[0.0, 2.0]], 1: [[1.0, 3.0]]}
    one = _net(text, schema.TRAIN)
    got = [one.forward()[1]["y"].tolist() for _ in range(4)]
    assert got == [[0, 1], [2, 3], [4, 5], [0, 1]]
    test = _net(text, schema.TEST, 1, 2)                                   # TEST: every rank reads all
    assert test.forward()[1]["y"].tolist() == [0, 1]


def test_hdf5_and_dummy_data(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["data"] = np.arange(5 * 3, dtype=np.float32).reshape(5, 3)
        f["label"] = np.arange(5, dtype=np.float32)
    (tmp_path / "list.txt").write_text(str(tmp_path / "a.h5") + "\n")
    net = _net(f'layer {{ name: "h" type: "HDF5Data" top: "data" top: "label" hdf5_data_param {{ source: "{tmp_path / "list.txt"}" batch_size: 3 }} }}\n'
               'layer { name: "dd" type: "DummyData" top: "z" top: "c" dummy_data_param { shape { dim: 2 dim: 3 } shape { dim: 4 } '
               'data_filler { type: "gaussian" } data_filler { type: "constant" value: 7 } } }')
    _, a = net.forward()
    _, b = net.forward()
    assert a["label"].tolist() == [0, 1, 2] and b["label"].tolist() == [3, 4, 0]
    assert a["data"].shape == (3, 3) and a["z"].shape == (2, 3) and a["c"].tolist() == [7.0] * 4
    assert not torch.equal(a["z"], b["z"])                                 # non-constant fillers refill
    with pytest.raises(Exception, match="no dataset 'nope'"):
        _net(f'layer {{ name: "h" type: "HDF5Data" top: "nope" hdf5_data_param {{ source: "{tmp_path / "list.txt"}" batch_size: 3 }} }}')


@pytest.mark.parametrize("means, channels, words", [
    ("mean_value: 104 mean_value: 117 mean_value: 123", 1, "3 mean_value entries for 1-channel data; give a single mean_value"),
    ("mean_value: 1 mean_value: 2", 3, "give one mean_value for all channels or one per channel (3)"),
])
def test_mean_values_that_do_not_fit_the_channels_say_what_to_give(means: str, channels: int, words: str) -> None:
    import torch

    from ddl.caffe.data.transform import Transformer
    tp = protofile.parse_text(f"transform_param {{ {means} }}", schema.LayerParameter()).transform_param
    t = Transformer(tp, schema.TRAIN, torch.Generator(), where="layer 'data'")
    with pytest.raises(protofile.CaffeFormatError, match=words.replace("(", r"\(").replace(")", r"\)")):
        t(np.zeros((channels, 4, 4), np.float32))
    with pytest.raises(protofile.CaffeFormatError, match="mean_value entries"):
        t.batch(np.zeros((2, channels, 4, 4), np.float32))


def test_leveldb_is_the_default_backend_and_reads_like_an_lmdb(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("plyvel")
    x = np.arange(5 * 2 * 3 * 3, dtype=np.uint8).reshape(5, 2, 3, 3)
    assert convert.from_arrays(tmp_path / "ldb", x, np.arange(5), backend=LEVELDB) == 5
    assert convert.from_arrays(tmp_path / "mdb", x, np.arange(5)) == 5
    assert backend_of(tmp_path / "ldb") == LEVELDB and backend_of(tmp_path / "mdb") == LMDB

    def layer(src: Path, backend: str) -> str:
        return f'layer {{ name: "d" type: "Data" top: "x" top: "y" data_param {{ source: "{src}" batch_size: 3 {backend} }} }}'
    # No backend: Caffe's default, LevelDB; the records and their order are the LMDB's.
    unset = _net(layer(tmp_path / "ldb", ""), schema.TRAIN)
    lmdb_net = _net(layer(tmp_path / "mdb", "backend: LMDB"), schema.TRAIN)
    for _ in range(3):                                                      # wraps after 5 records, as Caffe
        a, b = unset.forward()[1], lmdb_net.forward()[1]
        np.testing.assert_array_equal(a["x"].numpy(), b["x"].numpy())
        np.testing.assert_array_equal(a["y"].numpy(), b["y"].numpy())
    # A TRAIN and a TEST net of one process read the same LevelDB (one handle, two cursors).
    both = [_net(layer(tmp_path / "ldb", "backend: LEVELDB"), ph) for ph in (schema.TRAIN, schema.TEST)]
    assert [n.forward()[1]["y"].tolist() for n in both] == [[0, 1, 2], [0, 1, 2]]
    # Unset over an LMDB: read, with a warning that Caffe would look for a LevelDB there.
    with caplog.at_level("WARNING", logger="ddl.caffe"):
        assert _net(layer(tmp_path / "mdb", ""), schema.TEST).forward()[1]["y"].tolist() == [0, 1, 2]
    assert "Caffe would read" in caplog.text and "add backend: LMDB" in caplog.text
    with pytest.raises(CaffeFormatError, match="backend is LEVELDB but .*mdb is a LMDB; set backend: LMDB"):
        _net(layer(tmp_path / "mdb", "backend: LEVELDB"))
    with pytest.raises(CaffeFormatError, match=r"holds no database \(expected LEVELDB \(Caffe's default"):
        _net(layer(tmp_path / "missing", ""))
    with pytest.raises(CaffeFormatError, match="exists; a LevelDB is written to a new folder"):
        convert.from_arrays(tmp_path / "ldb", x, np.arange(5), backend=LEVELDB)


def test_a_leveldb_another_process_holds_is_read_from_a_snapshot(tmp_path: Path) -> None:
    # LevelDB's LOCK admits one process; another rank reading the same source reads hard links to its files.
    pytest.importorskip("plyvel")
    import subprocess
    import sys
    x = np.arange(4, dtype=np.uint8).reshape(4, 1, 1, 1)
    convert.from_arrays(tmp_path / "ldb", x, np.arange(4), backend=LEVELDB)
    holder = subprocess.Popen([sys.executable, "-c", "import plyvel, sys; db = plyvel.DB(sys.argv[1]); print('held', flush=True); "
                               "sys.stdin.read()", str(tmp_path / "ldb")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        before = sorted(p.name for p in (tmp_path / "ldb").iterdir())
        reader = DatumReader(tmp_path / "ldb", backend=LEVELDB, rank=1, size=2)
        assert [reader.next().label for _ in range(3)] == [1, 3, 1]
        assert reader.count == 4
        assert len([p for p in tmp_path.iterdir() if p.name.startswith(".ldb.ddl-")]) == 1    # the snapshot, beside it
        assert sorted(p.name for p in (tmp_path / "ldb").iterdir()) == before  # the holder's folder is as it was
    finally:
        holder.communicate("", timeout=30)




# --- Dealing a source over ranks: the world reads each item once per epoch, as one process at the world's batch.
ITEMS, RANKS, BATCH = 10, 3, 2      # 10 items do not divide into 3 ranks x 2: every epoch ends mid-iteration


def _sources(tmp_path: Path) -> dict[str, str]:
    """Each kind of data layer over ITEMS items whose label is the item's index."""
    x = np.arange(ITEMS, dtype=np.uint8).reshape(ITEMS, 1, 1, 1)
    convert.from_arrays(tmp_path / "lmdb", x, np.arange(ITEMS))
    convert.from_arrays(tmp_path / "ldb", x, np.arange(ITEMS), backend=LEVELDB)
    lines = []
    for i in range(ITEMS):
        Image.fromarray(np.full((2, 2, 3), i, np.uint8)).save(tmp_path / f"im{i}.png")
        lines.append(f"im{i}.png {i}")
    (tmp_path / "images.txt").write_text("\n".join(lines) + "\n")
    with h5py.File(tmp_path / "rows.h5", "w") as f:
        f["x"] = np.arange(ITEMS, dtype=np.float32).reshape(ITEMS, 1)
        f["y"] = np.arange(ITEMS, dtype=np.float32)
    (tmp_path / "h5.txt").write_text(str(tmp_path / "rows.h5") + "\n")
    data = 'layer {{ name: "d" type: "Data" top: "x" top: "y" data_param {{ source: "{}" batch_size: {{b}} backend: {} {} }} }}'
    image = ('layer {{ name: "d" type: "ImageData" top: "x" top: "y" image_data_param {{ source: "{}" root_folder: "{}/" '
             'batch_size: {{b}} {} }} }}')
    h5 = 'layer {{ name: "d" type: "HDF5Data" top: "x" top: "y" hdf5_data_param {{ source: "{}" batch_size: {{b}} {} }} }}'
    return {
        "lmdb": data.format(tmp_path / "lmdb", "LMDB", ""),
        "lmdb rand_skip": data.format(tmp_path / "lmdb", "LMDB", "rand_skip: 4"),
        "leveldb": data.format(tmp_path / "ldb", "LEVELDB", ""),
        "imagedata": image.format(tmp_path / "images.txt", tmp_path, ""),
        "imagedata shuffled": image.format(tmp_path / "images.txt", tmp_path, "shuffle: true"),
        "hdf5": h5.format(tmp_path / "h5.txt", ""),
        "hdf5 shuffled": h5.format(tmp_path / "h5.txt", "shuffle: true"),
    }


def _world_reads(text: str, size: int, iterations: int) -> list[int]:
    """The items a world of ``size`` TRAIN nets (batch BATCH x RANKS / size each) reads, in stream order."""
    batch = BATCH * RANKS // size
    nets = [Net(protofile.parse_text(text.replace("{b}", str(batch)), schema.NetParameter()), schema.TRAIN,
                gen=torch.Generator().manual_seed(5), rank=r, size=size, quiet=True) for r in range(size)]
    stream: list[int] = []
    for _ in range(iterations):
        batches = [[int(v) for v in net.forward()[1]["y"].tolist()] for net in nets]
        stream += [batches[r][k] for k in range(batch) for r in range(size)]   # rank r's k-th is position r + k*size
    return stream


@pytest.mark.parametrize("kind", ["lmdb", "lmdb rand_skip", "leveldb", "imagedata", "imagedata shuffled", "hdf5",
                                  "hdf5 shuffled"])
def test_three_ranks_read_each_item_once_per_epoch_as_one_process_does(tmp_path: Path, kind: str) -> None:
    text = _sources(tmp_path)[kind]
    iterations = 5                                                          # 30 reads: three whole epochs
    world = _world_reads(text, RANKS, iterations)
    epochs = [world[e * ITEMS:(e + 1) * ITEMS] for e in range(len(world) // ITEMS)]
    for e, epoch in enumerate(epochs):
        assert sorted(epoch) == list(range(ITEMS)), f"{kind}: epoch {e} of the world's stream is {epoch}"
    if "shuffled" in kind:
        assert epochs[0] != epochs[1] != epochs[2], f"{kind}: every epoch should be reshuffled: {epochs}"
    # One process at the world's batch reads the same stream.
    assert _world_reads(text, 1, iterations) == world
    if "rand_skip" in kind:
        assert world[0] == 4
