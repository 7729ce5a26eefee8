"""What an optimizer wrapper of ddl.tensorflow.keras passes through to the one it wraps.

DistributedOptimizer and LocalSGD/DiLoCo step with ``self.inner_optimizer``: its learning
rate (a schedule or a value a callback sets), its iteration count and its loss scaling
are the ones that count, so the wrapper reads and writes them there. Its saved config
holds the wrapped optimizer under ``"optimizer"`` and the hook under ``"compression"``.
"""

from __future__ import annotations

from typing import Any

import keras

from ..hook_reducer import hook_from_config


class PassesThrough:
    """Mixed in before ``keras.optimizers.Optimizer``: the settings above are
    ``self.inner_optimizer``'s."""

    inner_optimizer: Any

    @property
    def learning_rate(self) -> Any:
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, value: Any) -> None:
        self.inner_optimizer.learning_rate = value

    @property
    def iterations(self) -> Any:
        return self.inner_optimizer.iterations

    def scale_loss(self, loss: Any) -> Any:
        return self.inner_optimizer.scale_loss(loss)

    def finalize_variable_values(self, var_list: Any) -> None:
        self.inner_optimizer.finalize_variable_values(var_list)

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> Any:
        """The wrapper a ``get_config()`` describes, around the optimizer it holds."""
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(config.pop("optimizer"), custom_objects=custom_objects)
        config["compression"] = hook_from_config(config.get("compression"))
        return cls(inner, **config)  # type: ignore[call-arg]  # the subclass takes the optimizer first
