"""HDF5Data (batches from the HDF5 files a list names) and HDF5Output (blobs written to an HDF5 file)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ddl.caffe.data.dealing import StreamDeal
from ddl.caffe.formats import schema
from ddl.caffe.layers.base import Layer
from ddl.caffe.layers.inputs import DataLayer


class HDF5Data(DataLayer):
    """Rows of the datasets named like the tops, from the .h5 files listed in ``source``; dealt over the ranks in TRAIN
    (:class:`ddl.caffe.data.dealing.StreamDeal`), reshuffled every epoch with ``shuffle``."""

    type = "HDF5Data"
    params = ("hdf5_data_param",)
    max_tops = 1 << 16

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        import h5py
        p = self.lp.hdf5_data_param
        src = Path(p.source)
        if not src.exists():
            raise self.error(f"hdf5_data_param.source {src} does not exist (it lists one .h5 file per line)")
        files = [ln.strip() for ln in src.read_text().splitlines() if ln.strip()]
        if not files or p.batch_size <= 0:
            raise self.error("source must list at least one file and batch_size must be positive")
        parts: list[list[np.ndarray]] = [[] for _ in self.top]
        for f in files:
            with h5py.File(f, "r") as h:
                for i, t in enumerate(self.top):
                    if t not in h:
                        raise self.error(f"{f} has no dataset '{t}' (datasets: {sorted(h.keys())})")
                    parts[i].append(np.asarray(h[t], dtype=np.float32))
        self.arrays = [np.concatenate(ps) for ps in parts]
        n = self.arrays[0].shape[0]
        if any(a.shape[0] != n for a in self.arrays):
            raise self.error(f"datasets have different row counts {[a.shape[0] for a in self.arrays]}")
        shard = self.phase == schema.TRAIN and self.size > 1
        # Drawn from the net's generator, which starts alike on every rank: the ranks share the epochs' order.
        seed = int(torch.randint(1 << 62, (1,), generator=self.gen)) if p.shuffle else None
        self.deal = StreamDeal(n, rank=self.rank if shard else 0, size=self.size if shard else 1, seed=seed)
        self.batch = p.batch_size

    def top_shapes(self) -> list[tuple[int, ...]]:
        return [(self.batch, *a.shape[1:]) for a in self.arrays]

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        take = np.array([self.deal.next() for _ in range(self.batch)])
        return [torch.from_numpy(np.ascontiguousarray(a[take])) for a in self.arrays]


class HDF5Output(Layer):
    """Writes its two bottoms (as datasets ``data`` and ``label``) to ``file_name``; rows of later batches are appended
    (Caffe writes the first batch and then fails on the second)."""

    type = "HDF5Output"
    params = ("hdf5_output_param",)
    min_bottoms, max_bottoms = 2, 2
    min_tops, max_tops = 0, 0

    def setup(self, shapes: list[tuple[int, ...]]) -> None:
        import h5py
        name = self.lp.hdf5_output_param.file_name
        if not name:
            raise self.error("hdf5_output_param.file_name is required")
        if shapes[0][0] != shapes[1][0]:
            raise self.error(f"data and label need the same number of items, got {list(shapes[0])} and {list(shapes[1])}")
        try:
            self.file = h5py.File(name, "w")
        except OSError as e:
            raise self.error(f"cannot create {name}: {e}") from None
        self.sets = {k: self.file.create_dataset(k, shape=(0, *s[1:]), maxshape=(None, *s[1:]), dtype="f4")
                     for k, s in (("data", shapes[0]), ("label", shapes[1]))}

    def forward(self, bottoms: list[torch.Tensor]) -> list[torch.Tensor]:
        if not self.update_stats:
            return []
        for (_, ds), b in zip(self.sets.items(), bottoms, strict=True):
            arr = b.detach().cpu().numpy()
            n = ds.shape[0]
            ds.resize(n + arr.shape[0], axis=0)
            ds[n:] = arr
        self.file.flush()
        return []
