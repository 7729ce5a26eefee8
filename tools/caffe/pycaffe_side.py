"""Real Caffe's side of ``python -m tools.caffe.parity``: run under the Python that pycaffe was built for.

Usage: ``PYTHONPATH=<peer>/python python3 pycaffe_side.py WORKDIR PHASE`` (PHASE: TRAIN or TEST). It imports only
pycaffe and numpy (no ddl: that Python has neither torch nor ddl), reads ``WORKDIR/net.prototxt``,
``WORKDIR/weights.caffemodel`` (written by ddl), ``WORKDIR/inputs.npz`` and ``WORKDIR/output_diffs.npz``, and
writes what Caffe computes:

- ``whole.npz``: after one forward and one backward of the whole net, ``data/<blob>`` and ``diff/<blob>`` of every
  blob and ``param/<layer>/<i>`` of every parameter diff;
- ``layers/<index>.npz``: layer by layer, each layer run alone (``Net._forward(i, i)``, ``Net._backward(i, i)``) on
  Caffe's own bottom data with random top diffs: ``bottom/<j>``, ``top/<j>``, ``top_diff/<j>``,
  ``bottom_diff/<j>`` and ``param/<i>``;
- ``layers.txt``: one line per layer, ``index name type``.
"""

from __future__ import annotations

import os
import sys

import numpy as np


def _zero_param_diffs(net) -> None:  # noqa: ANN001 - a pycaffe Net
    for blobs in net.params.values():
        for b in blobs:
            b.diff[...] = 0


def whole_net(net, inputs, output_diffs, out: str) -> None:  # noqa: ANN001
    """One forward and one backward of the whole net; every blob's data and diff, every parameter diff."""
    for name, value in inputs.items():
        net.blobs[name].data[...] = value
    net.forward()
    saved = {f"data/{n}": b.data.copy() for n, b in net.blobs.items()}
    _zero_param_diffs(net)
    diffs = {n: output_diffs[n] for n in output_diffs.files}
    for n, d in diffs.items():
        net.blobs[n].diff[...] = d
    net._backward(len(net.layers) - 1, 0)
    saved.update({f"diff/{n}": b.diff.copy() for n, b in net.blobs.items()})
    for name, blobs in net.params.items():
        for i, b in enumerate(blobs):
            saved[f"param/{name}/{i}"] = b.diff.copy()
    np.savez(out, **saved)


def layer_by_layer(net, inputs, folder: str, seed: int) -> None:  # noqa: ANN001
    """Each layer alone on Caffe's own bottoms, with random top diffs; bottoms are taken before the layer runs
    (an in-place layer overwrites them)."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    for name, value in inputs.items():
        net.blobs[name].data[...] = value
    names = list(net._layer_names)
    with open(os.path.join(folder, "..", "layers.txt"), "w") as listing:
        for i, layer in enumerate(net.layers):
            listing.write(f"{i} {names[i]} {layer.type}\n")
            bottoms = [net.blobs[b].data.copy() for b in net.bottom_names[names[i]]]
            net._forward(i, i)
            tops = [net.blobs[t].data.copy() for t in net.top_names[names[i]]]
            top_diffs = [rng.standard_normal(t.shape).astype(np.float32) for t in tops]
            for t, d in zip(net.top_names[names[i]], top_diffs, strict=True):
                net.blobs[t].diff[...] = d
            for b in layer.blobs:
                b.diff[...] = 0
            for b in net.bottom_names[names[i]]:
                if b not in net.top_names[names[i]]:
                    net.blobs[b].diff[...] = 0
            net._backward(i, i)
            saved = {}
            for j, x in enumerate(bottoms):
                saved[f"bottom/{j}"] = x
                saved[f"bottom_diff/{j}"] = net.blobs[net.bottom_names[names[i]][j]].diff.copy()
            for j, (y, g) in enumerate(zip(tops, top_diffs, strict=True)):
                saved[f"top/{j}"] = y
                saved[f"top_diff/{j}"] = g
            for j, b in enumerate(layer.blobs):
                saved[f"param/{j}"] = b.diff.copy()
            np.savez(os.path.join(folder, f"{i}.npz"), **saved)


def main() -> None:
    work, phase_name = sys.argv[1], sys.argv[2]
    os.environ.setdefault("GLOG_minloglevel", "2")
    import caffe

    caffe.set_mode_cpu()
    caffe.set_random_seed(0)
    phase = caffe.TRAIN if phase_name == "TRAIN" else caffe.TEST
    proto, weights = os.path.join(work, "net.prototxt"), os.path.join(work, "weights.caffemodel")
    inputs = dict(np.load(os.path.join(work, "inputs.npz")))
    output_diffs = np.load(os.path.join(work, "output_diffs.npz"))
    whole_net(caffe.Net(proto, phase, weights=weights), inputs, output_diffs, os.path.join(work, "whole.npz"))
    # A fresh net: the whole-net pass changed TRAIN-phase BatchNorm statistics.
    layer_by_layer(caffe.Net(proto, phase, weights=weights), inputs, os.path.join(work, "layers"), seed=1)


if __name__ == "__main__":
    main()
