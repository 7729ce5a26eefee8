"""The table of supported layer types."""

from __future__ import annotations

from .base import Layer
from .common import (
    BatchNorm,
    Concat,
    Dropout,
    Eltwise,
    Flatten,
    InnerProduct,
    ReLU,
    Reshape,
    Scale,
    Sigmoid,
    Softmax,
    TanH,
)
from .data_layers import Data, DummyData, HDF5Data, Input
from .loss import Accuracy, EuclideanLoss, SoftmaxWithLoss
from .vision import LRN, Convolution, Pooling

LAYERS: dict[str, type[Layer]] = {c.type: c for c in (
    Data, Input, DummyData, HDF5Data, Convolution, Pooling, InnerProduct, ReLU, Sigmoid, TanH, Dropout, LRN,
    BatchNorm, Scale, Eltwise, Concat, Flatten, Reshape, Softmax, SoftmaxWithLoss, Accuracy, EuclideanLoss)}
