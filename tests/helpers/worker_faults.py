"""Faults injected into the model workers."""

from __future__ import annotations


class Broken(BaseException):
    """Not an Exception: the handler guards let it through, as they would a thread's end."""
