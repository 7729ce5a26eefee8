"""Runs numpy functions on TF tensors: directly when eager, as ``tf.numpy_function`` in graphs.

What is copied (TF 2.21, CPU tensors):
- eager: ``np.asarray(tensor)`` is a read-only view of the tensor's buffer (no copy;
  ``tensor.numpy()`` would copy); results go back through ``tf.convert_to_tensor``,
  which copies once into a new tensor.
- in a ``tf.function``: ``tf.numpy_function`` hands the Python function views of its
  input tensors (no copy) and copies the returned arrays into the output tensors.
- the core copies each input once into its fused buffer (allreduce) or receive buffer.
So one collective costs one copy in and one copy out, as with DLPack plus a result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import tensorflow as tf
from ddl.engine.naming import manifest_name


def executing_eagerly() -> bool:
    return bool(tf.executing_eagerly())


def host_view(t: Any) -> np.ndarray:
    """A numpy view (eager, CPU: no copy) of a tensor or variable's value."""
    return np.asarray(t if isinstance(t, tf.Tensor) else tf.convert_to_tensor(t))


def graph_name(kind: str, name: str | None, *tensors: Any) -> str:
    """``name``, or a deterministic one for a collective traced into a graph.

    Graph ops run on TensorFlow's executor threads, so unnamed requests cannot be
    matched by submission order. The name comes from what every rank traces alike: the
    kind, the tensors' static shapes and dtypes, and how many such collectives this
    process traced before (:func:`ddl.engine.naming.manifest_name`).
    """
    if name is not None:
        return name
    manifest = [(str(t.shape), t.dtype.name) for t in tensors]
    return manifest_name(f"ddl.tf.{kind}", manifest)


def check_not_xla(what: str) -> None:
    """Raise a clear error when tracing into an XLA-compiled function (no Python there)."""
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - private module moved
        return
    if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        raise ValueError(
            f"ddl.tensorflow {what} cannot run inside an XLA-compiled function: its collectives "
            "call into Python (tf.numpy_function), which XLA cannot compile. Turn XLA off: "
            "model.compile(..., jit_compile=False) or tf.function(jit_compile=False) (Keras's default "
            "jit_compile='auto' turns XLA on wherever TensorFlow sees a GPU)."
        )


def host_call(
    fn: Callable[..., Sequence[np.ndarray]], inputs: Sequence[Any], out_dtypes: Sequence[tf.DType],
    out_shapes: Sequence[Any], *, what: str,
) -> list[tf.Tensor]:
    """Run ``fn(*arrays) -> arrays`` on ``inputs``; outputs get ``out_dtypes``/``out_shapes``.

    Eager: called at once on views of the inputs. In a graph: one stateful
    ``tf.numpy_function`` op whose outputs carry the given static shapes.
    """
    if executing_eagerly():
        outs = fn(*[host_view(t) for t in inputs])
        return [tf.convert_to_tensor(o, dtype=d) for o, d in zip(outs, out_dtypes, strict=True)]
    check_not_xla(what)

    def checked(*arrays: np.ndarray) -> list[np.ndarray]:
        outs = fn(*arrays)
        return [np.asarray(o, dtype=d.as_numpy_dtype) for o, d in zip(outs, out_dtypes, strict=True)]

    outs = tf.numpy_function(checked, list(inputs), list(out_dtypes), stateful=True, name="ddl_" + what.replace(" ", "_"))
    if not isinstance(outs, (list, tuple)):
        outs = [outs]
    for o, shape in zip(outs, out_shapes, strict=True):
        o.set_shape(shape)
    return list(outs)
