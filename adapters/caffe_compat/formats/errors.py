"""The error every Caffe-file reader raises: it names the file, the place and what to do."""

from __future__ import annotations


class CaffeFormatError(ValueError):
    """A Caffe file could not be read; the message names the file, place and what to do."""
