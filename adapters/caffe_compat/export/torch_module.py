"""``ddl.caffe.load``: a Caffe net and its weights as a ``torch.nn.Module`` for PyTorch code (fine-tuning, ddl.torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ddl.caffe.export.state_dict import blob_names, module_name
from ddl.caffe.formats import schema
from ddl.caffe.formats.protofile import read_net
from ddl.caffe.net.net import Net
from ddl.caffe.net.weights import load_weights


class CaffeModule(torch.nn.Module):
    """A Net whose blobs are the module's parameters (``<layer>.weight``, ``<layer>.bias``, ...) and buffers
    (BatchNorm's ``mean``, ``variance``, ``scale_factor``, as Caffe keeps them).

    ``forward(*inputs)`` takes the Input tops in order (or any data tops by name, ``forward(data=x)``) and
    returns the net's output blob when there is one, else a dict of them; data layers whose tops are not
    given read their own data. ``loss(...)`` returns the net's weighted loss. ``train()`` and ``eval()`` switch Dropout and BatchNorm between Caffe's
    TRAIN and TEST behaviour. Parameters with ``lr_mult: 0`` have ``requires_grad=False``.
    """

    def __init__(self, net: Net) -> None:
        super().__init__()
        self.net = net
        self.input_names = [t for la in net.layers if la.type == "Input" for t in la.top]
        seen: set[str] = set()
        for la in net.layers:
            if not la.blobs:
                continue
            name = module_name(la.name)
            if name in seen:
                raise ValueError(f"two layers map to the module name '{name}'; rename one of them")
            seen.add(name)
            sub = torch.nn.Module()
            for bname, t in zip(blob_names(la.type, len(la.blobs), bottoms=len(la.bottom)), la.blobs, strict=True):
                if isinstance(t, torch.nn.Parameter):
                    sub.register_parameter(bname, t)
                else:
                    sub.register_buffer(bname, t)
            self.add_module(name, sub)
        self.train(net.phase == schema.TRAIN)

    def train(self, mode: bool = True) -> CaffeModule:
        super().train(mode)
        phase = schema.TRAIN if mode else schema.TEST
        for la in self.net.layers:
            la.phase = phase
            if la.type == "BatchNorm" and not la.lp.batch_norm_param.HasField("use_global_stats"):
                la.global_stats = not mode                                     # type: ignore[attr-defined]
        return self

    def _run(self, inputs: tuple[torch.Tensor, ...], named: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if len(inputs) > len(self.input_names):
            raise ValueError(f"the net takes {len(self.input_names)} inputs ({', '.join(self.input_names)}), got {len(inputs)}")
        feeds = dict(zip(self.input_names, inputs, strict=False))
        data_tops = {t for la in self.net.layers if la.is_data for t in la.top}
        unknown = set(named) - data_tops
        if unknown:
            raise ValueError(f"no data top named {sorted(unknown)}; the net's data tops are {sorted(data_tops)}")
        feeds.update(named)
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise ValueError(f"missing input(s) {missing}")
        return self.net.forward(feeds=feeds or None)

    def forward(self, *inputs: torch.Tensor, **named: torch.Tensor) -> Any:
        _, blobs = self._run(inputs, named)
        outs = {o: blobs[o] for o in self.net.outputs}
        return next(iter(outs.values())) if len(outs) == 1 else outs

    def loss(self, *inputs: torch.Tensor, **named: torch.Tensor) -> torch.Tensor:
        """The net's own objective: its loss tops weighted by their loss_weight (e.g. GoogLeNet's three heads).

        Data tops may be given by name (``model.loss(data=x, label=y)``) in place of the net's data layers.
        """
        total, _ = self._run(inputs, named)
        return total


def load(prototxt: str | Path, caffemodel: str | Path | None = None, *, phase: str = "test",
         stages: tuple[str, ...] = (), device: str | torch.device | None = None) -> CaffeModule:
    """A Caffe net (V0/V1 nets are upgraded) with its .caffemodel weights as a ``torch.nn.Module``.

    Args:
        prototxt: the net definition (a deploy net, or a train_val net whose data layers then read data).
        caffemodel: the weights (.caffemodel or .caffemodel.h5); left out, the fillers initialise them.
        phase: ``"test"`` (eval mode) or ``"train"``: which layers the net's include/exclude rules keep.
        stages: NetState stages.

    Example:
        >>> import ddl.caffe, ddl.torch as dt                                 # doctest: +SKIP
        >>> model = ddl.caffe.load("deploy.prototxt", "bvlc_alexnet.caffemodel", phase="train")
        >>> opt = dt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3),
        ...                               named_parameters=model.named_parameters())
    """
    if phase not in ("train", "test"):
        raise ValueError(f"phase must be 'train' or 'test', got {phase!r}")
    net = Net(read_net(prototxt), schema.TRAIN if phase == "train" else schema.TEST, stages=stages, quiet=True, device=device)
    if caffemodel is not None:
        load_weights(net, str(caffemodel))
    return CaffeModule(net)
