"""What Caffe's upgrade tools do: V0 and V1 nets (and weights) to today's format, legacy inputs, BatchNorm params, solver type."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ddl.caffe.formats import schema

log = logging.getLogger("ddl.caffe")


V0_TYPES = {
    "accuracy": "ACCURACY", "bnll": "BNLL", "concat": "CONCAT", "conv": "CONVOLUTION", "data": "DATA",
    "dropout": "DROPOUT", "euclidean_loss": "EUCLIDEAN_LOSS", "flatten": "FLATTEN", "hdf5_data": "HDF5_DATA",
    "hdf5_output": "HDF5_OUTPUT", "im2col": "IM2COL", "images": "IMAGE_DATA", "infogain_loss": "INFOGAIN_LOSS",
    "innerproduct": "INNER_PRODUCT", "lrn": "LRN", "multinomial_logistic_loss": "MULTINOMIAL_LOGISTIC_LOSS",
    "pool": "POOLING", "relu": "RELU", "sigmoid": "SIGMOID", "softmax": "SOFTMAX", "softmax_loss": "SOFTMAX_LOSS",
    "split": "SPLIT", "tanh": "TANH", "window_data": "WINDOW_DATA",
}


V1_TYPES = {
    "NONE": "", "ABSVAL": "AbsVal", "ACCURACY": "Accuracy", "ARGMAX": "ArgMax", "BNLL": "BNLL", "CONCAT": "Concat",
    "CONTRASTIVE_LOSS": "ContrastiveLoss", "CONVOLUTION": "Convolution", "DECONVOLUTION": "Deconvolution",
    "DATA": "Data", "DROPOUT": "Dropout", "DUMMY_DATA": "DummyData", "EUCLIDEAN_LOSS": "EuclideanLoss",
    "ELTWISE": "Eltwise", "EXP": "Exp", "FLATTEN": "Flatten", "HDF5_DATA": "HDF5Data", "HDF5_OUTPUT": "HDF5Output",
    "HINGE_LOSS": "HingeLoss", "IM2COL": "Im2col", "IMAGE_DATA": "ImageData", "INFOGAIN_LOSS": "InfogainLoss",
    "INNER_PRODUCT": "InnerProduct", "LRN": "LRN", "MEMORY_DATA": "MemoryData",
    "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss", "MVN": "MVN", "POOLING": "Pooling", "POWER": "Power",
    "RELU": "ReLU", "SIGMOID": "Sigmoid", "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss",
    "SILENCE": "Silence", "SOFTMAX": "Softmax", "SOFTMAX_LOSS": "SoftmaxWithLoss", "SPLIT": "Split",
    "SLICE": "Slice", "TANH": "TanH", "WINDOW_DATA": "WindowData", "THRESHOLD": "Threshold",
}


# V1 layer parameter fields copied as they are into the new LayerParameter.
V1_PARAMS = ("accuracy_param", "argmax_param", "concat_param", "contrastive_loss_param", "convolution_param",
             "data_param", "dropout_param", "dummy_data_param", "eltwise_param", "exp_param", "hdf5_data_param",
             "hdf5_output_param", "hinge_loss_param", "image_data_param", "infogain_loss_param",
             "inner_product_param", "lrn_param", "memory_data_param", "mvn_param", "pooling_param", "power_param",
             "relu_param", "sigmoid_param", "softmax_param", "slice_param", "tanh_param", "threshold_param",
             "window_data_param", "transform_param", "loss_param")


class UpgradeError(ValueError):
    """A legacy net cannot be upgraded; the message names the layer and the field."""


def _v1_enum(name: str) -> int:
    return int(schema.V1LayerParameter.LayerType.Value(name))


def _v0_padding(net: Any) -> None:
    """Fold V0 'padding' layers into the conv/pool layer that reads them (UpgradeV0PaddingLayers)."""
    last_top: dict[str, int] = {b: -1 for b in net.input}
    kept = []
    layers = list(net.layers)
    for i, conn in enumerate(layers):
        lp = conn.layer
        new = schema.V1LayerParameter()
        new.CopyFrom(conn)
        for j, b in enumerate(conn.bottom):
            if b not in last_top:
                raise UpgradeError(f"V0 layer '{lp.name}': unknown bottom blob '{b}'")
            src = last_top[b]
            if src >= 0 and layers[src].layer.type == "padding":
                if lp.type not in ("conv", "pool") or len(conn.bottom) != 1:
                    raise UpgradeError(f"V0 layer '{lp.name}' ({lp.type}) reads a padding layer; only a single-input conv or pool may")
                new.layer.pad = layers[src].layer.pad
                new.bottom[j] = layers[src].bottom[0]
        if lp.type != "padding":
            kept.append(new)
        for t in conn.top:
            last_top[t] = i
    del net.layers[:]
    net.layers.extend(kept)


def _v0_layer(conn: Any) -> Any:
    """One V0 layer as a V1 layer (UpgradeV0LayerParameter): its flat fields moved into the typed params."""
    v0 = conn.layer
    out = schema.V1LayerParameter()
    out.bottom.extend(conn.bottom)
    out.top.extend(conn.top)
    if not v0.HasField("type"):
        return out
    t = v0.type
    if t not in V0_TYPES:
        raise UpgradeError(f"V0 layer '{v0.name}': unknown type '{t}'")
    out.name, out.type = v0.name, _v1_enum(V0_TYPES[t])
    out.blobs.extend(v0.blobs)
    out.blobs_lr.extend(v0.blobs_lr)
    out.weight_decay.extend(v0.weight_decay)
    conv_ip = {"conv": out.convolution_param, "innerproduct": out.inner_product_param}
    source_of = {"data": out.data_param, "hdf5_data": out.hdf5_data_param, "images": out.image_data_param,
                 "window_data": out.window_data_param, "infogain_loss": out.infogain_loss_param}
    batch_of = {"data": out.data_param, "hdf5_data": out.hdf5_data_param, "images": out.image_data_param,
                "window_data": out.window_data_param}

    def bad(field: str) -> UpgradeError:
        return UpgradeError(f"V0 layer '{v0.name}': field {field} does not apply to type '{t}'")

    for f in ("num_output", "biasterm", "weight_filler", "bias_filler"):
        if v0.HasField(f):
            if t not in conv_ip:
                raise bad(f)
            target = "bias_term" if f == "biasterm" else f
            if f.endswith("filler"):
                getattr(conv_ip[t], target).CopyFrom(getattr(v0, f))
            else:
                setattr(conv_ip[t], target, getattr(v0, f))
    for f in ("pad", "kernelsize", "stride"):
        if v0.HasField(f):
            target = {"pad": "pad", "kernelsize": "kernel_size", "stride": "stride"}[f]
            if t == "conv":
                getattr(out.convolution_param, target).append(getattr(v0, f))
            elif t == "pool":
                setattr(out.pooling_param, target, getattr(v0, f))
            else:
                raise bad(f)
    if v0.HasField("group"):
        if t != "conv":
            raise bad("group")
        out.convolution_param.group = v0.group
    if v0.HasField("pool"):
        if t != "pool":
            raise bad("pool")
        out.pooling_param.pool = v0.pool
    if v0.HasField("dropout_ratio"):
        if t != "dropout":
            raise bad("dropout_ratio")
        out.dropout_param.dropout_ratio = v0.dropout_ratio
    for f in ("local_size", "alpha", "beta", "k"):
        if v0.HasField(f):
            if t != "lrn":
                raise bad(f)
            setattr(out.lrn_param, f, getattr(v0, f))
    if v0.HasField("source"):
        if t not in source_of:
            raise bad("source")
        source_of[t].source = v0.source
    if v0.HasField("scale"):
        out.transform_param.scale = v0.scale
    if v0.HasField("meanfile"):
        out.transform_param.mean_file = v0.meanfile
    if v0.HasField("batchsize"):
        if t not in batch_of:
            raise bad("batchsize")
        batch_of[t].batch_size = v0.batchsize
    if v0.HasField("cropsize"):
        out.transform_param.crop_size = v0.cropsize
    if v0.HasField("mirror"):
        out.transform_param.mirror = v0.mirror
    if v0.HasField("rand_skip"):
        if t not in ("data", "images"):
            raise bad("rand_skip")
        (out.data_param if t == "data" else out.image_data_param).rand_skip = v0.rand_skip
    for f, target in (("shuffle_images", "shuffle"), ("new_height", "new_height"), ("new_width", "new_width")):
        if v0.HasField(f):
            if t != "images":
                raise bad(f)
            setattr(out.image_data_param, target, getattr(v0, f))
    if v0.HasField("concat_dim"):
        if t != "concat":
            raise bad("concat_dim")
        out.concat_param.concat_dim = v0.concat_dim
    for f, target in (("det_fg_threshold", "fg_threshold"), ("det_bg_threshold", "bg_threshold"),
                      ("det_fg_fraction", "fg_fraction"), ("det_context_pad", "context_pad"),
                      ("det_crop_mode", "crop_mode")):
        if v0.HasField(f):
            if t != "window_data":
                raise bad(f)
            setattr(out.window_data_param, target, getattr(v0, f))
    if v0.HasField("hdf5_output_param"):
        if t != "hdf5_output":
            raise bad("hdf5_output_param")
        out.hdf5_output_param.CopyFrom(v0.hdf5_output_param)
    return out


def _data_transformation(net: Any) -> None:
    """Move the V1 data layers' scale/mean_file/crop_size/mirror into transform_param (UpgradeNetDataTransformation)."""
    kinds = {_v1_enum("DATA"): "data_param", _v1_enum("IMAGE_DATA"): "image_data_param",
             _v1_enum("WINDOW_DATA"): "window_data_param"}
    for layer in net.layers:
        field = kinds.get(layer.type)
        if field is None:
            continue
        p = getattr(layer, field)
        for f in ("scale", "mean_file", "crop_size", "mirror"):
            if p.HasField(f):
                setattr(layer.transform_param, f, getattr(p, f))
                p.ClearField(f)


def _v1_layer(v1: Any) -> Any:
    """One V1 layer as a LayerParameter (UpgradeV1LayerParameter)."""
    lp = schema.LayerParameter()
    lp.bottom.extend(v1.bottom)
    lp.top.extend(v1.top)
    if v1.HasField("name"):
        lp.name = v1.name
    lp.include.extend(v1.include)
    lp.exclude.extend(v1.exclude)
    if v1.HasField("type"):
        lp.type = V1_TYPES[schema.V1LayerParameter.LayerType.Name(v1.type)]
    lp.blobs.extend(v1.blobs)

    def spec(i: int) -> Any:
        while len(lp.param) <= i:
            lp.param.add()
        return lp.param[i]
    for i, name in enumerate(v1.param):
        spec(i).name = name
    for i, mode in enumerate(v1.blob_share_mode):
        spec(i).share_mode = mode
    for i, lr in enumerate(v1.blobs_lr):
        spec(i).lr_mult = lr
    for i, decay in enumerate(v1.weight_decay):
        spec(i).decay_mult = decay
    lp.loss_weight.extend(v1.loss_weight)
    for f in V1_PARAMS:
        if v1.HasField(f):
            getattr(lp, f).CopyFrom(getattr(v1, f))
    if v1.HasField("layer"):
        raise UpgradeError(f"layer '{v1.name}' still holds a V0 layer after the V0 upgrade")
    return lp


def _inputs(net: Any) -> None:
    """Net-level input/input_shape/input_dim as a first Input layer (UpgradeNetInput)."""
    if not len(net.input):
        return
    if len(net.input_shape) or len(net.input_dim):
        lp = schema.LayerParameter(name="input", type="Input")
        lp.top.extend(net.input)
        for i in range(len(net.input)):
            shape = lp.input_param.shape.add()
            if len(net.input_shape):
                if i >= len(net.input_shape):
                    raise UpgradeError(f"net '{net.name}': {len(net.input)} inputs but {len(net.input_shape)} input_shape entries")
                shape.CopyFrom(net.input_shape[i])
            else:
                if len(net.input_dim) < 4 * (i + 1):
                    raise UpgradeError(f"net '{net.name}': {len(net.input)} inputs need 4 input_dim values each, got {len(net.input_dim)}")
                shape.dim.extend(net.input_dim[4 * i: 4 * i + 4])
        layers = [lp] + list(net.layer)
        del net.layer[:]
        net.layer.extend(layers)
    net.ClearField("input")
    net.ClearField("input_shape")
    net.ClearField("input_dim")


def _batchnorm(net: Any) -> None:
    """BatchNorm layers that declare three param specs get lr_mult and decay_mult 0 (UpgradeNetBatchNorm)."""
    for lp in net.layer:
        if lp.type == "BatchNorm" and len(lp.param) == 3:
            for spec in lp.param:
                spec.lr_mult = 0.0
                spec.decay_mult = 0.0


def net_format(net: Any) -> str:
    """'V0', 'V1' or 'V2' (today's)."""
    if any(la.HasField("layer") for la in net.layers):
        return "V0"
    return "V1" if len(net.layers) else "V2"


def upgrade_net(net: Any, *, source: str = "<net>") -> list[str]:
    """Upgrade ``net`` in place to today's format as Caffe does on load; returns what was done (empty: nothing).

    Raises:
        UpgradeError: the legacy net is inconsistent (named layer and field).
    """
    done = []
    if net_format(net) == "V0":
        _v0_padding(net)
        upgraded = [_v0_layer(conn) for conn in net.layers]
        del net.layers[:]
        net.layers.extend(upgraded)
        done.append("V0 layers to V1")
    if len(net.layers):
        _data_transformation(net)
        if len(net.layer):
            raise UpgradeError(f"{source}: the net mixes V1 'layers' and current 'layer' blocks; use one format")
        upgraded = [_v1_layer(v1) for v1 in net.layers]
        del net.layers[:]
        net.layer.extend(upgraded)
        done.append("V1 layers to the current format")
    if len(net.input):
        _inputs(net)
        done.append("net inputs to an Input layer")
    if any(lp.type == "BatchNorm" and len(lp.param) == 3 for lp in net.layer):
        _batchnorm(net)
        done.append("BatchNorm param specs to lr_mult 0")
    for what in done:
        log.info("%s: upgraded %s", source, what)
    return done


def upgrade_solver(sp: Any, *, source: str = "<solver>") -> list[str]:
    """The solver's deprecated ``solver_type`` enum to ``type``, and a missing or folder snapshot_prefix (Caffe's rules)."""
    done = []
    if sp.HasField("solver_type"):
        if sp.HasField("type"):
            raise UpgradeError(f"{source}: give the solver type once: 'type' (string) or the deprecated 'solver_type', not both")
        sp.type = {0: "SGD", 1: "Nesterov", 2: "AdaGrad", 3: "RMSProp", 4: "AdaDelta", 5: "Adam"}[sp.solver_type]
        sp.ClearField("solver_type")
        done.append("solver_type to type")
    if source != "<solver>":
        stem = Path(source).with_suffix("")
        if not sp.HasField("snapshot_prefix"):
            sp.snapshot_prefix = str(stem)
            done.append(f"snapshot_prefix (not given) to {sp.snapshot_prefix}")
        elif Path(sp.snapshot_prefix).is_dir():
            sp.snapshot_prefix = str(Path(sp.snapshot_prefix) / stem.name)
            done.append(f"snapshot_prefix (a folder) to {sp.snapshot_prefix}")
    return done
