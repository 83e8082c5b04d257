"""The one base of the errors cord-ops raises on purpose for a user to read.

A :class:`CordOpsError`'s message is the whole explanation, one line first (the command
line prints it as ``error: MESSAGE``); any other exception is a fault of its own kind and
is printed as ``error: Type: message``. Each subclass keeps the built-in base it had
(``ValueError``, ``RuntimeError``), so code that catches those still catches it.
"""

from __future__ import annotations


class CordOpsError(Exception):
    """An error whose message is meant for the operator as it stands."""
