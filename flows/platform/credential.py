"""The credential of the Prefect servers cord-ops starts, and the owner-only files around it.

Why: a Prefect server on 127.0.0.1 answers every local account, and its API creates flow
runs that the owner's processes execute. Prefect's own answer is HTTP basic
authentication: the server takes ``PREFECT_SERVER_API_AUTH_STRING`` (``user:password``) and
refuses every request but ``GET /health`` and ``GET /ready`` without it (401); clients send
``PREFECT_API_AUTH_STRING``. cord-ops makes the string itself, :func:`new`: 256 random bits,
never printed, never in a command line.

- The managed server (:mod:`flows.platform.managed_server`) gets a new one at each start,
  kept in ``<state folder>/api-auth`` (0600) inside the state folder (0700,
  :func:`private_folder`); every cord-ops command that uses that server reads it from there
  and hands it to Prefect through its settings context, from which Prefect passes it to the
  flow-run processes it starts (their environment, readable only by this user).
- A command's temporary server (:mod:`flows.platform.temporary_server`) gets one that lives
  in that command's memory only.

Files are created owner-only from their first byte (``O_CREAT`` with mode 0600, so no
window where another account could open them), whatever the umask.
"""

from __future__ import annotations

import base64
import os
import secrets
import stat
from pathlib import Path

from flows.errors import CordOpsError

#: Prefect's settings: the server's expected string, and the one its clients send.
SERVER_SETTING = "PREFECT_SERVER_API_AUTH_STRING"
CLIENT_SETTING = "PREFECT_API_AUTH_STRING"
#: The managed server's credential, in its state folder.
AUTH_FILE = "api-auth"
USER = "cord-ops"


class StateFolderError(CordOpsError, PermissionError):
    """A state folder that another account owns or could replace files in."""


def new() -> str:
    """A fresh ``user:password`` for a server's basic authentication."""
    return f"{USER}:{secrets.token_urlsafe(32)}"


def authorization(auth: str) -> dict[str, str]:
    """The HTTP header Prefect's clients send for ``auth`` (``user:password``)."""
    return {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()}


def private_folder(folder: Path) -> Path:
    """``folder`` created if missing, owned by this user and 0700; returns it.

    A folder that exists already is tightened to 0700 (an older cord-ops made it 0755).
    One that belongs to another account, or is a link, is refused: whoever owns it could
    read the credential put there or replace the files this user then trusts.
    """
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass
    info = folder.lstat()
    found = ("a link" if stat.S_ISLNK(info.st_mode)
             else "not a folder" if not stat.S_ISDIR(info.st_mode)
             else None if info.st_uid == os.geteuid() else f"owned by uid {info.st_uid}")
    if found is not None:
        raise StateFolderError(f"{folder}: the state folder must be a folder of this user "
                               f"(uid {os.geteuid()}); it is {found}")
    os.chmod(folder, 0o700)
    return folder


def _private_opener(path, flags):
    return os.open(path, flags | os.O_NOFOLLOW, 0o600)


def open_private(path: Path, mode: str = "ab"):
    """``open(path, mode)`` of a file created 0600 (logs beside the state)."""
    return open(path, mode, opener=_private_opener)  # noqa: SIM115 - the caller closes it


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (temporary file, fsync, rename), the file 0600
    from its creation; returns the path. The temporary name is :mod:`cord_ops.atomic`'s,
    so the leftover of a killed writer is swept by the next atomic write there."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def auth_file(folder: Path) -> Path:
    return Path(folder) / AUTH_FILE


def save(folder: Path, auth: str) -> Path:
    """Keep ``auth`` as the managed server's credential in ``folder`` (0600)."""
    return write_private(auth_file(folder), auth)


def load(folder: Path) -> str | None:
    """The managed server's credential kept in ``folder``; None when there is none or this
    user cannot read it (another account's server: not this user's to use)."""
    try:
        auth = auth_file(folder).read_text().strip()
    except OSError:
        return None
    return auth or None
