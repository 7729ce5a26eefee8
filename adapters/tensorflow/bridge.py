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

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import tensorflow as tf
from ddl.engine.naming import manifest_name

from . import status_op
from .errors import as_tf_errors, status_of


def executing_eagerly() -> bool:
    return bool(tf.executing_eagerly())


def _recorder() -> Callable[[], bool]:
    try:  # TensorFlow's own test for an active GradientTape or ForwardAccumulator (not public API)
        from tensorflow.python.eager.record import could_possibly_record
    except ImportError:  # another layout: assume one may record, and keep the gradient
        return lambda: True
    return could_possibly_record  # type: ignore[no-any-return]


_could_record = _recorder()


def nothing_records() -> bool:
    """Eager, with no tape or forward accumulator recording on this thread: an op runs now and
    nothing will ask for its gradient, so a collective may skip ``tf.custom_gradient``, which
    cost an eager allreduce of 4 KiB 200 of its 330 us."""
    return bool(tf.executing_eagerly()) and not _could_record()


def host_view(t: Any) -> np.ndarray:
    """A numpy view (eager, CPU: no copy) of a tensor or variable's value."""
    return np.asarray(t if isinstance(t, tf.Tensor) else tf.convert_to_tensor(t))


def graph_name(kind: str, name: str | None, *tensors: Any) -> str:
    """``name``, or a deterministic one for a collective traced into a graph.

    Graph ops run on TensorFlow's executor threads, so unnamed requests cannot be
    matched by submission order. The name comes from what every rank traces alike: the
    kind, the number of tensors, and how many such collectives this process traced
    before (:func:`ddl.engine.naming.manifest_name`). Not the shapes or dtypes: ranks
    that pass different ones must meet under one name, so that the engine reports the
    mismatch on every rank instead of each rank waiting for a name the others never send.
    """
    if name is not None:
        return name
    return manifest_name(f"ddl.tf.{kind}", [len(tensors)])


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


# Collectives traced into a TF 1 graph (run by a Session), by graph: the last one traced.
_last_in_graph: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _plain_graph() -> Any:
    """The default graph when it is a TF 1 graph outside any control-flow context, else None.

    A Session runs a graph's ready ops in any order on a few threads, and each collective
    blocks its thread until every rank has submitted it: ranks that pick different ones
    first would wait on each other forever. So collectives in such a graph run in the
    order they were traced (the same on every rank). ``tf.function`` graphs need nothing:
    TF already runs their stateful ops in program order.
    """
    from tensorflow.python.framework.func_graph import FuncGraph

    graph = tf.compat.v1.get_default_graph()
    if isinstance(graph, FuncGraph) or graph._get_control_flow_context() is not None:
        return None
    return graph


def _order_after_previous(first: Any, last: Any) -> None:
    """Make ``first`` (a new collective's host call) wait for the previous collective's ``last`` op."""
    # A control input added to the new op, not a control_dependencies block: that would also
    # mark the previous op, which a Session may have run already (TF warns about that).
    graph = _plain_graph()
    previous = None if graph is None else _last_in_graph.get(graph)
    if previous is not None:
        first._add_control_input(previous)
    if graph is not None:
        _last_in_graph[graph] = last


def _placeholder(dtype: tf.DType) -> np.ndarray:
    # What a failed host call returns in place of each output: the status op fails first.
    return np.zeros((), dtype=dtype.as_numpy_dtype)


def _eager_tensor(out: Any, dtype: tf.DType) -> tf.Tensor:
    """A host call's eager output as a tensor: an array of the dtype already through
    ``tf.constant`` (18 us for 4 KiB here, against 43 us through ``convert_to_tensor``)."""
    if type(out) is np.ndarray and out.dtype == dtype.as_numpy_dtype:
        return tf.constant(out)
    return tf.convert_to_tensor(out, dtype=dtype)


def host_call(
    fn: Callable[..., Sequence[np.ndarray]], inputs: Sequence[Any], out_dtypes: Sequence[tf.DType],
    out_shapes: Sequence[Any], *, what: str,
) -> list[tf.Tensor]:
    """Run ``fn(*arrays) -> arrays`` on ``inputs``; outputs get ``out_dtypes``/``out_shapes``.

    Eager: called at once on views of the inputs. In a graph: one stateful
    ``tf.numpy_function`` op whose outputs carry the given static shapes. An error with a
    TensorFlow class (a mismatch is ``FailedPreconditionError``) leaves the graph with that
    class through :mod:`ddl.tensorflow.status_op` where it is built, else as ``UnknownError``.
    """
    fn = as_tf_errors(fn)
    if executing_eagerly():
        outs = fn(*[host_view(t) for t in inputs])
        return [_eager_tensor(o, d) for o, d in zip(outs, out_dtypes, strict=True)]
    check_not_xla(what)
    check_status = status_op.load()
    name = "ddl_" + what.replace(" ", "_")

    def run(*arrays: np.ndarray) -> list[np.ndarray]:
        outs = fn(*arrays)
        return [np.asarray(o, dtype=d.as_numpy_dtype) for o, d in zip(outs, out_dtypes, strict=True)]

    def run_with_status(*arrays: np.ndarray) -> list[np.ndarray]:
        try:
            outs = run(*arrays)
        except Exception as exc:
            status = status_of(exc)
            if status is None:
                raise
            return [*(_placeholder(d) for d in out_dtypes), np.int32(status[0]), np.bytes_(status[1].encode())]
        return [*outs, np.int32(0), np.bytes_(b"")]

    if check_status is None:
        made = tf.numpy_function(run, list(inputs), list(out_dtypes), stateful=True, name=name)
        outs = list(made) if isinstance(made, (list, tuple)) else [made]
        call_op = last_op = outs[0].op
    else:
        raw = tf.numpy_function(run_with_status, list(inputs), [*out_dtypes, tf.int32, tf.string], stateful=True,
                                name=name)
        call_op = raw[0].op
        outs = list(check_status(raw[-2], raw[-1], raw[:-2], name=name + "_status"))
        last_op = outs[0].op  # a later collective starts once this one's status is known good
    _order_after_previous(call_op, last_op)
    for o, shape in zip(outs, out_shapes, strict=True):
        o.set_shape(shape)
    return outs
