"""Credentials in URIs: :func:`flows.redact.redact` masks every
password and secret query value in text, :func:`flows.redact.credentials_to_environment`
moves a tracking URI's credential to MLflow's environment variables, and the command line's
error line never shows a password. The real runs against a basic-auth tracking server are
in test_secrets.py."""

from __future__ import annotations

import os
import string
from urllib.parse import quote

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from servers import free_port

from cord_ops import data
from flows.cli.main import main
from flows.redact import (
    MASK,
    PASSWORD_ENV,
    USERNAME_ENV,
    CredentialInURI,
    credentials_to_environment,
    redact,
)

#: Characters a password may hold raw in a URI's user info (RFC 3986: unreserved,
#: sub-delims, ':' and '%'-escapes); '@' is allowed too, as urllib reads up to the last one.
PASSWORD_CHARS = string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@"


@settings(max_examples=200, deadline=None)
@given(password=st.text(PASSWORD_CHARS, min_size=1, max_size=30),
       scheme=st.sampled_from(["http", "https", "postgresql+psycopg2", "mysql", "s3"]),
       before=st.sampled_from(["", "error: store ", "tracking: ", "(", "'", "uri="]),
       after=st.sampled_from(["", " is unreachable", "/api/2.0/mlflow/runs?x=1", ")", "'"]))
def test_redact_leaves_no_password_and_keeps_the_rest(password, scheme, before, after):
    secret = f"PW{password}"  # never a substring of the surrounding text by chance
    text = f"{before}{scheme}://bob:{secret}@db.example.com:5432{after}"
    shown = redact(text)
    assert secret not in shown
    assert shown == f"{before}{scheme}://bob:{MASK}@db.example.com:5432{after}"


@pytest.mark.parametrize("text, shown", [
    ("https://h/a.npz?X-Amz-Credential=AKIA%2F1&X-Amz-Date=20260101&X-Amz-Signature=f00d",
     f"https://h/a.npz?X-Amz-Credential={MASK}&X-Amz-Date=20260101&X-Amz-Signature={MASK}"),
    ("https://acct.blob.core.windows.net/c/m?sv=2024&sig=abc%3D&se=1",
     f"https://acct.blob.core.windows.net/c/m?sv=2024&sig={MASK}&se=1"),
    ("http://h/api?access_token=t0k&page=2", f"http://h/api?access_token={MASK}&page=2"),
    ("http://127.0.0.1:5000/path/a@b", "http://127.0.0.1:5000/path/a@b"),  # no user info
    ("models:/m@champion and runs:/abc/model", "models:/m@champion and runs:/abc/model"),
    ("http://alice@host:5000", "http://alice@host:5000"),  # a user name alone is no secret
])
def test_redact_masks_secret_query_values_and_nothing_else(text, shown):
    assert redact(text) == shown


def test_credentials_move_to_mlflow_environment_variables():
    environ = {USERNAME_ENV: "carol", PASSWORD_ENV: "old"}
    password = "p@ss:w/rd%?"
    uri = f"https://alice:{quote(password, safe='')}@mlflow.example.com:8443/prefix"
    assert credentials_to_environment(uri, environ) == "https://mlflow.example.com:8443/prefix"
    # the URI's own credential wins, decoded as MLflow sends it
    assert environ == {USERNAME_ENV: "alice", PASSWORD_ENV: password}
    # a raw '@' in the password: the host is after the last one, as urllib reads it
    assert credentials_to_environment("http://bob:p@ss@10.0.0.1:5000", environ) == \
        "http://10.0.0.1:5000"
    assert environ == {USERNAME_ENV: "bob", PASSWORD_ENV: "p@ss"}
    assert credentials_to_environment("http://:t0ken@10.0.0.1", environ) == "http://10.0.0.1"
    assert environ == {USERNAME_ENV: "", PASSWORD_ENV: "t0ken"}
    untouched = {}
    for plain in ("http://127.0.0.1:5000", "sqlite:///tmp/mlruns/mlflow.db",
                  "http://alice@host:5000", "databricks://profile"):
        assert credentials_to_environment(plain, untouched) == plain
    assert untouched == {}


def test_a_password_in_a_database_uri_is_refused_without_showing_it():
    with pytest.raises(CredentialInURI) as caught:
        credentials_to_environment("postgresql://bob:hunter2secret@db/mlflow", {})
    assert str(caught.value) == (
        "tracking URI postgresql://bob:***@db/mlflow: a password in a postgresql URI would "
        "be printed and stored with every run and Prefect parameter; keep it where the "
        "database driver reads it (PostgreSQL: ~/.pgpass or PGPASSWORD) and give the URI "
        "without it, or use an MLflow tracking server (http://user:password@host works: the "
        f"credential moves to {USERNAME_ENV} and {PASSWORD_ENV})")


def test_error_lines_never_show_the_password(tmp_path, monkeypatch, capsys):
    # set first, so that monkeypatch puts back what the command changes in this process
    for key in (USERNAME_ENV, PASSWORD_ENV):
        monkeypatch.setenv(key, "unset")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://nobody:other-Secret-9@127.0.0.1:9")
    monkeypatch.chdir(tmp_path)
    batch = data.save_npz(tmp_path / "batch.npz", np.eye(3), np.arange(3), "logits")
    store = f"127.0.0.1:{free_port()}"  # nothing listens there
    status = main(["--tracking-uri", f"http://alice:S3cretPass-Alice@{store}", "monitor",
                   "--data", str(batch), "--model-name", "m"])
    err = capsys.readouterr().err
    assert status == 1
    assert "S3cretPass-Alice" not in err and "other-Secret-9" not in err
    assert f"http://{store}" in err.strip().splitlines()[-1]

    # from the environment: the variable flow-run processes inherit loses it too
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://carol:Env-Secret-7@{store}")
    status = main(["monitor", "--data", str(batch), "--model-name", "m"])
    err = capsys.readouterr().err
    assert status == 1 and "Env-Secret-7" not in err
    assert f"http://{store}" in err.strip().splitlines()[-1]
    assert os.environ["MLFLOW_TRACKING_URI"] == f"http://{store}"
    assert (os.environ[USERNAME_ENV], os.environ[PASSWORD_ENV]) == ("carol", "Env-Secret-7")

    status = main(["--tracking-uri", "postgresql://bob:hunter2secret@127.0.0.1/mlflow",
                   "monitor", "--data", str(batch)])
    err = capsys.readouterr().err
    assert status == 1 and "hunter2secret" not in err and "PGPASSWORD" in err
