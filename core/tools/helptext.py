"""Help text from docstrings: the reST markup the docs build reads, turned into plain words for a terminal."""

from __future__ import annotations

import re


def plain(doc: str | None) -> str | None:
    """A docstring as help text: reST markup (``code``, :func:`name`) turned into plain words.

    Example:
        >>> plain("``ddl plan``: see :func:`ddl.reduction.cost.choose` and `x`")
        'ddl plan: see ddl.reduction.cost.choose and x'
    """
    if doc is None:
        return None
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc)
    text = re.sub(r"``([^`]+)``", r"\1", text)
    return re.sub(r"`([^`]+)`", r"\1", text)
