"""Credentials in URIs: never printed, never stored.

Two halves of one rule (docs/security.md, item 4):

- :func:`credentials_to_environment`, where a command takes its tracking URI: the user
  and password of an ``http(s)://user:password@host`` URI move to MLflow's own
  ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` (MLflow reads them for every
  request it makes) and the URI goes on without them. So the URI that every banner,
  summary, MLflow tag, Prefect flow-run and deployment parameter carries has no secret in
  it, and a deployment's runs find the credential in their process's environment. A
  password in any other scheme (a database URI) has no such channel and is refused.
- :func:`redact`, at every place text leaves the process (error lines, banners, MLflow
  params and tags): the password of any ``scheme://user:password@`` and the value of any
  query parameter that carries a secret (``token``, ``sig``, ``X-Amz-Signature``, ...) in
  the text become :data:`MASK`. That catches what the first half cannot: URIs inside
  exception messages of MLflow, Prefect or requests (a pre-signed artifact URL, an API
  URL from the environment).
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping
from urllib.parse import unquote, urlsplit, urlunsplit

from flows.errors import CordOpsError

MASK = "***"
USERNAME_ENV = "MLFLOW_TRACKING_USERNAME"
PASSWORD_ENV = "MLFLOW_TRACKING_PASSWORD"
#: Schemes whose credential MLflow takes from USERNAME_ENV / PASSWORD_ENV.
HTTP_SCHEMES = ("http", "https")

#: ``scheme://user:password@``: the password runs to the last ``@`` of the authority (as
#: ``urllib.parse.urlsplit`` reads it), so one holding a raw ``@`` is covered whole. A
#: user name alone is not a secret (tokens go in ``MLFLOW_TRACKING_TOKEN``).
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@?#'\"]*):"
                       r"(?P<password>[^\s/?#]*)@")
#: Query parameters (and fragments) whose value is a secret: names that hold token,
#: secret, password, signature, credential, key or auth (``X-Amz-Signature``,
#: ``access_token``, ``api_key``, Azure SAS ``sig``...).
_QUERY_SECRET = re.compile(
    r"(?P<head>[?&#;](?:[\w.\-]*(?:token|secret|passw(?:or)?d|pwd|signature|credential|"
    r"api[_\-]?key|apikey|auth)[\w.\-]*|sig|key|code)=)(?P<value>[^&#\s'\"]+)",
    re.IGNORECASE)


def redact(text: object) -> str:
    """``text`` (as ``str``) with every URI password and secret query value replaced by
    :data:`MASK`; the user name, host, path and other parameters stay readable."""
    text = str(text)
    if "://" in text:
        text = _USERINFO.sub(lambda m: f"{m['head']}:{MASK}@", text)
    if "=" in text:
        text = _QUERY_SECRET.sub(lambda m: f"{m['head']}{MASK}", text)
    return text


class CredentialInURI(CordOpsError, ValueError):
    """A URI carries a password that cannot be moved out of it."""


def credentials_to_environment(uri: str,
                               environ: MutableMapping[str, str] | None = None) -> str:
    """``uri`` without its ``user:password@``; for http(s) the two go to
    ``environ`` (default ``os.environ``) as MLflow's ``MLFLOW_TRACKING_USERNAME`` /
    ``MLFLOW_TRACKING_PASSWORD`` (the URI's own credential wins over values already there).

    A URI without a password comes back unchanged, and so does everything else in it. A
    password in another scheme (``postgresql://user:password@host/db``) raises
    :class:`CredentialInURI`: it would have to stay in the URI, and the URI is printed and
    stored with every run.
    """
    environ = os.environ if environ is None else environ
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    if parts.password is None:
        return uri
    if parts.scheme.lower() not in HTTP_SCHEMES:
        raise CredentialInURI(
            f"tracking URI {redact(uri)}: a password in a {parts.scheme} URI would be printed "
            "and stored with every run and Prefect parameter; keep it where the database "
            "driver reads it (PostgreSQL: ~/.pgpass or PGPASSWORD) and give the URI without "
            "it, or use an MLflow tracking server (http://user:password@host works: the "
            f"credential moves to {USERNAME_ENV} and {PASSWORD_ENV})")
    environ[USERNAME_ENV] = unquote(parts.username or "")
    environ[PASSWORD_ENV] = unquote(parts.password)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=host))
