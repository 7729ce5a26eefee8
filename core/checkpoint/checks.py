"""The read checks every adapter's checkpoint load makes, worded once.

An adapter maps its framework's model and optimizer onto a checkpoint; what it must
refuse before it applies anything — the ranks' weights saved apart loaded at another
world size without the optimizer that can join them, an optimizer asked for that was
not saved, another optimizer class — is the same in every framework, and so is what the
user is told to do. Each check raises :class:`~ddl.checkpoint.manifest.CheckpointError`
naming the manifest field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddl.checkpoint.manifest import CheckpointError


def check_replicas(where: Path, replicas: int | None, size: int, *, periodic: bool) -> None:
    """Ranks that saved different weights (LocalSGD/DiLoCo between rounds, ``replicas`` of
    them) load at their own world size, or at another only through the periodic optimizer
    that continues from what ``synchronize()`` would have given."""
    if replicas is not None and replicas != size and not periodic:
        raise CheckpointError(f"{where}: field meta.model.replicas is {replicas}: the {replicas} ranks that saved it "
                              "held different weights (LocalSGD or DiLoCo between rounds); load it at "
                              f"{replicas} ranks, or with optimizer= the LocalSGD/DiLoCo it was saved with (which "
                              "continues from what synchronize() would have given), not at "
                              f"{size} with the model alone")


def saved_optimizer(where: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """The manifest's optimizer record, which a load with ``optimizer=`` needs."""
    info = meta.get("optimizer")
    if info is None:
        raise CheckpointError(f"{where}: field meta.optimizer is missing: this checkpoint was saved without an "
                              "optimizer; load it with optimizer=None")
    return info  # type: ignore[no-any-return]


def check_class(where: Path, field: str, saved: Any, now: str, what: str = "the optimizer") -> None:
    """The class saved in ``field`` is the one being loaded into."""
    if saved != now:
        raise CheckpointError(f"{where}: field {field} is {saved}, {what} is {now}: build the one the "
                              "checkpoint was saved with")
