"""Who may talk to ``cord-ops serve``, and what they may change.

A server on 127.0.0.1 answers every local account and every web page open in a browser on
the machine: a page can send simple requests (``text/plain`` or form bodies, no custom
headers) and, through DNS rebinding, make its own host name resolve to 127.0.0.1. So:

- **Host**: every request names a host this server answers to: ``localhost``,
  ``127.0.0.1``, ``::1``, the address it is bound to, or one given with
  ``--allowed-hosts`` (``*``: any). A missing Host is 400, another one 421: a rebound page
  names its own host and is refused before any endpoint runs.
- **Token**: every POST that changes state (``/monitor/flush``, any later one) needs
  ``Authorization: Bearer <token>``; without it or with another 401. Scoring
  (``/invocations``) needs it too with ``--require-token``. A page cannot send the header
  without a CORS preflight, which this server never grants.
- **JSON only**: a POST whose content type is not ``application/json`` (missing included)
  is 415, so no simple request from a page gets past it.

The token comes from ``--token-file`` (a file only its owner can read), else
``CORD_OPS_SERVE_TOKEN``, else it is made at start (256 random bits) and written 0600 into
the store's 0700 state folder as ``serve-<port>.token``, removed when serve stops. It is
never printed: the banner names where it is.
"""

from __future__ import annotations

import dataclasses
import hmac
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

from flows.errors import CordOpsError

TOKEN_ENV = "CORD_OPS_SERVE_TOKEN"
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
#: Shortest token accepted from a file or the environment (a generated one has 43 chars).
MIN_TOKEN_CHARS = 16
JSON = "application/json"


class AccessError(CordOpsError, ValueError):
    """A token that cannot be used (unreadable, too short, readable by others)."""


@dataclass(frozen=True)
class Access:
    """The server's token (never in the repr), the hosts it answers to, and whether
    scoring takes the token too."""

    token: str = field(repr=False)
    hosts: frozenset[str] = LOCAL_HOSTS
    require_token: bool = False
    #: Where the token is, for the banner: a path or the environment variable's name.
    source: str = "memory"
    #: The file serve made and removes when it stops (None: the user's own).
    made: Path | None = None

    @classmethod
    def local(cls, token: str | None = None, bound: str | None = None,
              allowed_hosts: tuple[str, ...] = (), require_token: bool = False) -> Access:
        """An Access for a server bound to ``bound`` answering also ``allowed_hosts``;
        ``token`` None: one nobody knows (nothing that needs it can be done)."""
        hosts = set(LOCAL_HOSTS) | {h.strip().lower().strip("[]") for h in allowed_hosts
                                    if h.strip()}
        if bound and bound not in ("0.0.0.0", "::"):
            hosts.add(bound.lower())
        return cls(token=token or secrets.token_urlsafe(32), hosts=frozenset(hosts),
                   require_token=require_token)

    # ------------------------------------------------------------ checks
    def host_refusal(self, headers) -> tuple[int, str, str] | None:
        """(status, reason, message) for a request whose Host this server does not answer
        to, else None. ``headers``: the ASGI scope's list of (name, value) byte pairs."""
        host = next((value for name, value in headers if name == b"host"), None)
        if not host:
            return 400, "bad_host", "the request has no Host header"
        name = _host_name(host.decode("latin-1"))
        if "*" in self.hosts or name in self.hosts:
            return None
        return 421, "bad_host", (f"host {name!r} is not one this server answers to; start "
                                 f"serve with --allowed-hosts {name} to allow it")

    def post_refusal(self, headers, token: bool = True) -> tuple[int, str, str] | None:
        """(status, reason, message) for a POST without the token (when ``token``) or
        without a JSON content type, else None. ``headers``: Starlette's Headers."""
        if token and not self.authorized(headers.get("authorization")):
            return 401, "unauthorized", ("missing or wrong token: send 'Authorization: "
                                         "Bearer <token>' (the token serve printed the "
                                         "place of)")
        media = headers.get("content-type", "").split(";")[0].strip().lower()
        if media != JSON:
            return 415, "unsupported_media_type", (f"content-type {media or 'missing'!r}: "
                                                   f"expected {JSON}")
        return None

    def authorized(self, authorization: str | None) -> bool:
        scheme, _, given = (authorization or "").partition(" ")
        # constant time: the answer's timing says nothing about how much of a guess matched
        return scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), self.token.encode())

    def forget(self) -> None:
        """Remove the token file serve made (a stopped server's token opens nothing)."""
        if self.made is not None:
            self.made.unlink(missing_ok=True)


def _host_name(host: str) -> str:
    """The name of a Host header, without the port: ``[::1]:5005`` -> ``::1``. A header
    that is neither ``name[:port]`` nor ``[address][:port]`` comes back whole (and so
    matches no allowed name)."""
    host = host.strip().lower()
    if host.startswith("["):
        name, bracket, rest = host[1:].partition("]")
        return name if bracket and (not rest or rest.startswith(":")) else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def read_token_file(path: Path) -> str:
    """The token in ``path``; refused when others may read the file or it is too short."""
    try:
        info = path.stat()
        token = path.read_text().strip()
    except OSError as exc:
        raise AccessError(f"--token-file {path}: cannot read it ({exc.strerror or exc})") \
            from exc
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise AccessError(f"--token-file {path}: mode {stat.S_IMODE(info.st_mode):04o} lets "
                          f"other accounts read the token; chmod 600 it")
    return _checked(token, f"--token-file {path}")


def _checked(token: str, where: str) -> str:
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise AccessError(f"{where}: expected a token of at least {MIN_TOKEN_CHARS} "
                          f"characters without spaces")
    return token


def resolve(tracking_uri: str, port: int, bound: str, token_file: str | None,
            allowed_hosts: tuple[str, ...], require_token: bool) -> Access:
    """The Access of a serve start: the token from ``token_file``, else the environment,
    else a new one written 0600 to the store's state folder (module docstring)."""
    from flows.platform import credential
    from flows.platform.managed_server import state_folder

    made = None
    if token_file:
        token, source = read_token_file(Path(token_file)), str(token_file)
    elif os.environ.get(TOKEN_ENV):
        token, source = _checked(os.environ[TOKEN_ENV].strip(), TOKEN_ENV), TOKEN_ENV
    else:
        token = secrets.token_urlsafe(32)
        folder = credential.private_folder(state_folder(tracking_uri))
        made = credential.write_private(folder / f"serve-{port}.token", token)
        source = str(made)
    return dataclasses.replace(Access.local(token, bound, allowed_hosts, require_token),
                               source=source, made=made)
