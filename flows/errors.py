"""The one base of the errors cord-ops raises on purpose for a user to read.

A :class:`CordOpsError`'s message is the whole explanation, one line first (the command
line prints it as ``error: MESSAGE``); any other exception is a fault of its own kind and
is printed in words (:func:`in_words`), never by its class name. Each subclass keeps the
built-in base it had (``ValueError``, ``RuntimeError``), so code that catches those still
catches it.
"""

from __future__ import annotations


class CordOpsError(Exception):
    """An error whose message is meant for the operator as it stands."""


def in_words(exc: BaseException) -> str:
    """What went wrong in ``exc``, in words and without its class name (the command line's
    ``error:`` lines never print one): a file error names its file(s) and the system's
    reason, a missing key or memory says so, anything else is its own message."""
    if isinstance(exc, OSError) and exc.filename is not None:
        names = " -> ".join(str(name) for name in (exc.filename, exc.filename2)
                            if name is not None)
        reason = exc.strerror or (str(exc.args[-1]) if exc.args else "cannot be used")
        return f"{names}: {reason}"
    text = str(exc).strip()
    if isinstance(exc, KeyError):
        return f"missing key {text}" if text else "missing key"
    if isinstance(exc, MemoryError):
        return f"out of memory: {text}" if text else "out of memory"
    if isinstance(exc, TimeoutError) and not text:
        return "timed out"
    return text or "failed without a message (--verbose shows the traceback)"
