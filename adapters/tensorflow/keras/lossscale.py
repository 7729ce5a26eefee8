"""Keras's ``LossScaleOptimizer`` around ddl's optimizers: every rank decides alike whether to skip a step.

``model.compile`` under the ``mixed_float16`` policy wraps the optimizer it is given in a
``LossScaleOptimizer``, so ``compile(optimizer=dk.DistributedOptimizer(opt))`` trains through
``LossScaleOptimizer(DistributedOptimizer(opt))``. That wrapper checks the gradients it gets for
inf and NaN and calls the optimizer inside only when they are finite: with each rank's own
gradients, a rank that overflowed would skip the step, and its collective, alone. :func:`install`
(run by ``import ddl.tensorflow.keras``) has the check look at what every rank agrees on:
before it, an optimizer inside that defines ``_before_loss_scale_check`` hands back the
gradients to check (a DistributedOptimizer: the reduced ones; a sharded one: non-finite on
every rank if they are on any; LocalSGD/DiLoCo, whose ranks step alone, count a skipped
step so the rounds stay aligned). It also refuses a LossScaleOptimizer around a ddl optimizer
that holds one already (two scales, the second dividing the gradients again).
"""

from __future__ import annotations

import functools
from typing import Any

import keras
from keras.src import backend  # the name scope LossScaleOptimizer.apply builds itself in

_WRAPPED = "__ddl_agrees_first__"


def is_loss_scale(optimizer: Any) -> bool:
    """Whether ``optimizer`` is Keras's ``LossScaleOptimizer``."""
    return isinstance(optimizer, keras.optimizers.LossScaleOptimizer)


def install() -> None:
    """Wrap ``LossScaleOptimizer.__init__`` and ``apply`` once."""
    cls = keras.optimizers.LossScaleOptimizer
    if getattr(cls.apply, _WRAPPED, False):
        return
    init, apply = cls.__init__, cls.apply

    @functools.wraps(init)
    def checked_init(self: Any, inner_optimizer: Any, *args: Any, **kwargs: Any) -> None:
        held = getattr(inner_optimizer, "inner_optimizer", None)
        if hasattr(type(inner_optimizer), "_before_loss_scale_check") and is_loss_scale(held):
            raise ValueError(
                f"LossScaleOptimizer around {type(inner_optimizer).__name__}, which holds a LossScaleOptimizer "
                "already: the gradients would be unscaled twice. Under the mixed_float16 policy model.compile adds "
                f"the LossScaleOptimizer itself: pass {type(inner_optimizer).__name__} the plain optimizer (or "
                "compile with auto_scale_loss=False)")
        init(self, inner_optimizer, *args, **kwargs)

    @functools.wraps(apply)
    def agreed_apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        before = getattr(type(self.inner_optimizer), "_before_loss_scale_check", None)
        if before is not None:
            if not self.built:  # as apply() would: the scale must exist for the hook that reads it
                with backend.name_scope(self.name, caller=self):
                    self.build(trainable_variables)
                self.built = True
            grads = before(self.inner_optimizer, list(grads), trainable_variables, self)
        return apply(self, grads, trainable_variables)

    setattr(agreed_apply, _WRAPPED, True)
    cls.__init__ = checked_init
    cls.apply = agreed_apply
