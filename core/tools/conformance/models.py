"""The reference models of the conformance suite, built as ONNX graphs with seeded weights."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

OPSET = 17


def _uniform(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    bound = float(np.sqrt(6.0 / fan_in))  # He-uniform: keeps ReLU activations of order one
    return rng.uniform(-bound, bound, size=shape).astype(np.float32)


class _Builder:
    """Collects nodes and initializers of one chain."""

    def __init__(self, name: str, input_shape: tuple[int, ...], seed: int) -> None:
        from onnx import TensorProto, helper

        self.h, self.name, self.rng = helper, name, np.random.default_rng(seed)
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.current = "input"
        self.input = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", *input_shape])

    def const(self, name: str, arr: np.ndarray) -> str:
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def op(self, op: str, name: str, extra: list[str] | None = None, **attrs: Any) -> None:
        out = f"{name}_out"
        self.nodes.append(self.h.make_node(op, [self.current, *(extra or [])], [out], name=name, **attrs))
        self.current = out

    def gemm(self, name: str, n_in: int, n_out: int) -> None:
        w = self.const(f"{name}.W", _uniform(self.rng, (n_out, n_in), n_in))  # transB=1: (out, in)
        b = self.const(f"{name}.b", _uniform(self.rng, (n_out,), n_in) * 0.1)
        self.op("Gemm", name, [w, b], transB=1)

    def matmul_add(self, name: str, n_in: int, n_out: int) -> None:
        w = self.const(f"{name}.W", _uniform(self.rng, (n_in, n_out), n_in))  # MatMul: (in, out)
        b = self.const(f"{name}.b", _uniform(self.rng, (n_out,), n_in) * 0.1)
        self.op("MatMul", name, [w])
        self.op("Add", f"{name}_bias", [b])

    def conv(self, name: str, c_in: int, c_out: int, k: int, pad: int) -> None:
        w = self.const(f"{name}.W", _uniform(self.rng, (c_out, c_in, k, k), c_in * k * k))
        b = self.const(f"{name}.b", _uniform(self.rng, (c_out,), c_in * k * k) * 0.1)
        self.op("Conv", name, [w, b], kernel_shape=[k, k], pads=[pad] * 4, strides=[1, 1])

    def batchnorm(self, name: str, c: int) -> None:
        r = self.rng
        parts = [self.const(f"{name}.scale", r.uniform(0.8, 1.2, c).astype(np.float32)),
                 self.const(f"{name}.bias", r.uniform(-0.1, 0.1, c).astype(np.float32)),
                 self.const(f"{name}.mean", r.uniform(-0.2, 0.2, c).astype(np.float32)),
                 self.const(f"{name}.var", r.uniform(0.5, 1.5, c).astype(np.float32))]
        self.op("BatchNormalization", name, parts, epsilon=1e-5)

    def model(self) -> Any:
        from onnx import TensorProto, checker, helper

        out = helper.make_tensor_value_info(self.current, TensorProto.FLOAT, ["N", 10])
        graph = helper.make_graph(self.nodes, self.name, [self.input], [out], initializer=self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="ddl.tools.conformance")
        m.ir_version = 8  # readable by every onnxruntime of the last years
        checker.check_model(m)
        return m


def mlp(seed: int = 1) -> Any:
    """64-32-10 MLP for 8x8 digits: Gemm, Relu, MatMul+Add, Softmax."""
    b = _Builder("mlp", (64,), seed)
    b.gemm("fc1", 64, 32)
    b.op("Relu", "relu1")
    b.matmul_add("fc2", 32, 10)
    b.op("Softmax", "prob", axis=1)
    return b.model()


def cnn(seed: int = 2) -> Any:
    """Conv(1->6, 3x3) Relu MaxPool Conv(6->8, 3x3) Relu AveragePool Flatten Gemm LogSoftmax."""
    b = _Builder("cnn", (1, 8, 8), seed)
    b.conv("conv1", 1, 6, 3, 1)
    b.op("Relu", "relu1")
    b.op("MaxPool", "pool1", kernel_shape=[2, 2], strides=[2, 2])
    b.conv("conv2", 6, 8, 3, 1)
    b.op("Relu", "relu2")
    b.op("AveragePool", "pool2", kernel_shape=[2, 2], strides=[2, 2])
    b.op("Flatten", "flatten", axis=1)
    b.gemm("fc", 32, 10)
    b.op("LogSoftmax", "logprob", axis=1)
    return b.model()


def bn(seed: int = 3) -> Any:
    """Reshape (64 -> 1x8x8), Conv, BatchNormalization, Relu, AveragePool, Flatten, Gemm, Relu, Gemm."""
    b = _Builder("bn", (64,), seed)
    b.op("Reshape", "to_image", [b.const("to_image.shape", np.array([0, 1, 8, 8], np.int64))])
    b.conv("conv1", 1, 4, 3, 1)
    b.batchnorm("bn1", 4)
    b.op("Relu", "relu1")
    b.op("AveragePool", "pool1", kernel_shape=[2, 2], strides=[2, 2])
    b.op("Flatten", "flatten", axis=1)
    b.gemm("fc1", 64, 16)
    b.op("Relu", "relu2")
    b.gemm("fc2", 16, 10)
    return b.model()


MODELS: dict[str, Callable[[], Any]] = {"mlp": mlp, "cnn": cnn, "bn": bn}
