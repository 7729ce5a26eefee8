"""A Keras 3 optimizer's slot variables, found by shape of the optimizer rather than by name.

Keras's optimizers keep one list of slot variables per kind (Adam's ``_momentums`` and
``_velocities``, SGD's ``momentums``, Adagrad's ``_accumulators``), indexed like the
variables the optimizer was built with; checkpoints and elastic commits of a sharded
optimizer carry them per variable.
"""

from __future__ import annotations

from typing import Any

import keras

#: Optimizer attributes that are lists of variables but not slots.
_NOT_SLOTS = {"_variables", "_trainable_variables", "_model_variables_moving_average"}


def slots(optimizer: Any) -> dict[str, list[Any]]:
    """The optimizer's per-variable slot lists, by attribute name without its underscore.

    Example:
        >>> opt = keras.optimizers.Adam(); opt.build([keras.Variable([1.0])])  # doctest: +SKIP
        >>> sorted(slots(opt))                                                  # doctest: +SKIP
        ['momentums', 'velocities']
    """
    n = len(optimizer._trainable_variables)
    if n == 0:
        return {}
    found = {}
    for name, value in vars(optimizer).items():
        if name in _NOT_SLOTS or not isinstance(value, (list, tuple)) or len(value) != n:
            continue
        if all(isinstance(x, keras.Variable) for x in value):
            found[name.lstrip("_")] = list(value)
    return found


def local_index(optimizer: Any, variable: Any) -> int:
    """``variable``'s place among the variables ``optimizer`` was built with."""
    index: int = optimizer._get_variable_index(variable)
    return index
