"""The table of layer types: every type BVLC Caffe registers, plus the fork layers zoo nets carry."""

from __future__ import annotations

from ddl.caffe.layers import (
    accuracy,
    activations,
    axis_reduction,
    convolution,
    data_layer,
    detection,
    dropout,
    eltwise,
    hdf5,
    image_data,
    inputs,
    linear,
    loss,
    normalization,
    pooling,
    python_layer,
    recurrent,
    reshape,
    routing,
    selection,
    softmax,
    upsample,
)
from ddl.caffe.layers.base import Layer

_MODULES = (accuracy, activations, axis_reduction, convolution, data_layer, detection, dropout, eltwise, hdf5, image_data,
            inputs, linear, loss, normalization, pooling, python_layer, recurrent, reshape, routing, selection, softmax,
            upsample)

LAYERS: dict[str, type[Layer]] = {
    cls.type: cls
    for mod in _MODULES for cls in vars(mod).values()
    if isinstance(cls, type) and issubclass(cls, Layer) and cls.type and cls.__module__ == mod.__name__
}

# The 61 types BVLC Caffe (master) registers; the rest of LAYERS come from forks.
BVLC_TYPES = frozenset((
    "AbsVal", "Accuracy", "ArgMax", "BNLL", "BatchNorm", "BatchReindex", "Bias", "Clip", "Concat", "ContrastiveLoss",
    "Convolution", "Crop", "Data", "Deconvolution", "Dropout", "DummyData", "ELU", "Eltwise", "Embed", "EuclideanLoss",
    "Exp", "Filter", "Flatten", "HDF5Data", "HDF5Output", "HingeLoss", "Im2col", "ImageData", "InfogainLoss",
    "InnerProduct", "Input", "LRN", "LSTM", "LSTMUnit", "Log", "MVN", "MemoryData", "MultinomialLogisticLoss", "PReLU",
    "Parameter", "Pooling", "Power", "Python", "RNN", "ReLU", "Reduction", "Reshape", "SPP", "Scale", "Sigmoid",
    "SigmoidCrossEntropyLoss", "Silence", "Slice", "Softmax", "SoftmaxWithLoss", "Split", "Swish", "TanH",
    "Threshold", "Tile", "WindowData"))
FORK_TYPES = frozenset(LAYERS) - BVLC_TYPES
