"""Checkpoints in one framework-neutral format: a shard per rank, one manifest, loadable at any world size.

A checkpoint is a folder: one data file per rank and section (``model``, ``optimizer``)
holding the tensors that rank wrote, and ``manifest.json`` naming every tensor (dtype,
shape, file, offset), every file (size, sha256), the optimizer's class and
hyperparameters and the user's ``extra``. A save commits by replacing the manifest
atomically, so a crash leaves the previous checkpoint loadable. Loading reads only what a
rank needs, checking each file's digest first; the adapters
(:mod:`ddl.torch.checkpoint`, :mod:`ddl.tensorflow.keras.checkpoint`) map their models
and optimizers onto it, re-split for the loading world. numpy and files only: no
framework is imported here.

Example:
    >>> from ddl.checkpoint import Checkpoint                # doctest: +SKIP
    >>> Checkpoint.open("ckpt").manifest.world_size           # doctest: +SKIP
    4
"""

from __future__ import annotations

from ddl.checkpoint.collective import Checkpoint, save, together
from ddl.checkpoint.files import Reader, Tensor
from ddl.checkpoint.manifest import CheckpointError, Entry, FileRecord, Manifest, read_manifest

__all__ = ["Checkpoint", "CheckpointError", "Entry", "FileRecord", "Manifest", "Reader", "Tensor",
           "read_manifest", "save", "together"]
