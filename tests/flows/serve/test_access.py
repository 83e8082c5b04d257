"""Who may talk to ``cord-ops serve``: Host names, the token on every POST
that changes state, JSON-only POSTs; in process, over the real application."""

from __future__ import annotations

import stat

import pytest
from starlette.testclient import TestClient

from flows.serve import access as serve_access
from flows.serve.app import build_app
from flows.serve.metrics import Metrics
from flows.serve.traffic import TrafficMonitor

TOKEN = "t0ken-for-the-tests-only-0123456789"
AUTH = {"authorization": f"Bearer {TOKEN}"}
JSON = {"content-type": "application/json"}


class _NoModelYet:
    """The follower's surface the app reads, before any version loaded (not under test)."""

    name, alias, current, last_error = "m", "champion", None, None
    rejected: dict = {}
    last_poll = None
    interval = 1.0

    def start(self):
        pass

    def stop(self):
        pass


@pytest.fixture
def app_parts(tmp_path):
    metrics = Metrics()
    traffic = TrafficMonitor(f"sqlite:///{tmp_path}/never.db", "m", 100)
    return metrics, traffic


def _client(app_parts, require_token=False, allowed=(), bound="127.0.0.1",
            base="http://127.0.0.1:5005"):
    metrics, traffic = app_parts
    access = serve_access.Access.local(TOKEN, bound, allowed, require_token)
    return TestClient(build_app(_NoModelYet(), metrics, 0.0, 100, traffic, None, access),
                      base_url=base)


def test_flush_needs_the_token(app_parts):
    with _client(app_parts) as http:
        assert http.post("/monitor/flush", headers=JSON).status_code == 401
        wrong = {**JSON, "authorization": "Bearer " + TOKEN[:-1] + "x"}
        assert http.post("/monitor/flush", headers=wrong).status_code == 401
        assert http.post("/monitor/flush", headers={**JSON, "authorization": TOKEN}
                         ).status_code == 401  # no scheme
        # with it, the endpoint runs: nothing to flush yet
        assert http.post("/monitor/flush", headers={**JSON, **AUTH}).status_code == 409
        metrics = http.get("/metrics").text
    assert 'cord_serve_errors_total{reason="unauthorized"} 3.0' in metrics


def test_post_takes_json_only(app_parts):
    """A web page's simple request (text/plain, a form, no type) is refused."""
    with _client(app_parts) as http:
        for media in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {**AUTH, **({"content-type": media} if media else {})}
            flush = http.post("/monitor/flush", headers=headers, content=b"{}")
            assert flush.status_code == 415, (media, flush.text)
            scoring = http.post("/invocations", headers=headers, content=b'{"inputs": [[1]]}')
            assert scoring.status_code == 415, (media, scoring.text)
            assert scoring.json()["reason"] == "unsupported_media_type"
        # a JSON POST reaches the endpoint (no model loaded yet: 503)
        assert http.post("/invocations", headers=JSON, content=b'{"inputs": [[1]]}'
                         ).status_code == 503


def test_scoring_takes_the_token_when_required(app_parts):
    body = b'{"inputs": [[1]]}'
    with _client(app_parts) as http:
        assert http.post("/invocations", headers=JSON, content=body).status_code == 503
    with _client(app_parts, require_token=True) as http:
        assert http.post("/invocations", headers=JSON, content=body).status_code == 401
        assert http.post("/invocations", headers={**JSON, **AUTH}, content=body
                         ).status_code == 503


@pytest.mark.parametrize("host", ["localhost", "localhost:5005", "127.0.0.1:5005", "[::1]:5005"])
def test_local_host_names_are_answered(app_parts, host):
    with _client(app_parts) as http:
        assert http.get("/version", headers={"host": host}).status_code == 200


def test_other_host_names_are_refused_before_any_endpoint(app_parts):
    """A page rebinding evil.example to 127.0.0.1 sends Host: evil.example."""
    with _client(app_parts) as http:
        for path in ("/version", "/metrics", "/monitor"):
            refused = http.get(path, headers={"host": "evil.example:5005"})
            assert refused.status_code == 421, (path, refused.text)
        flush = http.post("/monitor/flush", headers={**JSON, **AUTH, "host": "evil.example"})
        assert flush.status_code == 421
        assert "--allowed-hosts evil.example" in flush.json()["error"]
        assert 'cord_serve_errors_total{reason="bad_host"} 4.0' in http.get("/metrics").text
    with _client(app_parts, allowed=("scorer.internal",)) as http:
        assert http.get("/version", headers={"host": "scorer.internal:80"}).status_code == 200
        assert http.get("/version", headers={"host": "evil.example"}).status_code == 421
    with _client(app_parts, allowed=("*",)) as http:
        assert http.get("/version", headers={"host": "evil.example"}).status_code == 200


def test_a_request_without_host_is_400(app_parts):
    access = serve_access.Access.local(TOKEN)
    assert access.host_refusal([(b"accept", b"*/*")])[0] == 400
    assert access.host_refusal([(b"host", b"")])[0] == 400


def test_the_bound_address_is_answered(app_parts):
    with _client(app_parts, bound="10.1.2.3", base="http://10.1.2.3:5005") as http:
        assert http.get("/version").status_code == 200


def test_a_new_token_is_owner_only_in_the_state_folder_and_removed(tmp_path, monkeypatch):
    monkeypatch.delenv(serve_access.TOKEN_ENV, raising=False)
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    access = serve_access.resolve(uri, 5123, "127.0.0.1", None, (), False)
    made = tmp_path / "store" / "prefect" / "serve-5123.token"
    assert access.made == made and access.source == str(made)
    assert made.read_text() == access.token and len(access.token) == 43  # 256 bits
    assert stat.S_IMODE(made.stat().st_mode) == 0o600
    assert stat.S_IMODE(made.parent.stat().st_mode) == 0o700
    assert access.token not in repr(access)
    again = serve_access.resolve(uri, 5124, "127.0.0.1", None, (), False)
    assert again.token != access.token  # one per start
    access.forget()
    assert not made.exists()
    access.forget()  # twice: nothing left to remove is no error


def test_a_token_from_the_environment_or_a_file(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    monkeypatch.setenv(serve_access.TOKEN_ENV, TOKEN)
    from_env = serve_access.resolve(uri, 5123, "127.0.0.1", None, (), False)
    assert from_env.token == TOKEN and from_env.source == serve_access.TOKEN_ENV
    assert from_env.made is None and not (tmp_path / "store").exists()
    monkeypatch.setenv(serve_access.TOKEN_ENV, "short")
    with pytest.raises(serve_access.AccessError, match="at least 16"):
        serve_access.resolve(uri, 5123, "127.0.0.1", None, (), False)

    path = tmp_path / "token"
    path.write_text(TOKEN[::-1] + "\n")
    path.chmod(0o600)
    from_file = serve_access.resolve(uri, 5123, "127.0.0.1", str(path), (), False)
    assert from_file.token == TOKEN[::-1] and from_file.source == str(path)
    path.chmod(0o644)
    with pytest.raises(serve_access.AccessError, match="chmod 600"):
        serve_access.resolve(uri, 5123, "127.0.0.1", str(path), (), False)
    with pytest.raises(serve_access.AccessError, match="cannot read"):
        serve_access.read_token_file(tmp_path / "missing")


@pytest.mark.parametrize(("header", "name"), [
    ("Example.COM", "example.com"), ("example.com:80", "example.com"), ("::1", "::1"),
    ("[::1]", "::1"), ("[::1]:5005", "::1"), ("[fe80::1]:80", "fe80::1"),
    ("[::1", "[::1"), ("[::1]x]", "[::1]x]"), ("[::1]]:80", "[::1]]:80")])
def test_host_names_are_read_without_the_port(header, name):
    assert serve_access._host_name(header) == name


def test_which_hosts_are_answered():
    assert len(serve_access.Access.local().token) == 43  # none given: 256 unknown bits
    local = serve_access.Access.local(TOKEN)
    assert local.hosts == serve_access.LOCAL_HOSTS and not local.require_token
    for wildcard in ("0.0.0.0", "::"):  # every address: no name of its own
        assert serve_access.Access.local(TOKEN, wildcard).hosts == serve_access.LOCAL_HOSTS
    named = serve_access.Access.local(TOKEN, "Scorer.Local", (" [FE80::1] ", "", "b.example"))
    assert named.hosts == serve_access.LOCAL_HOSTS | {"scorer.local", "fe80::1", "b.example"}
    assert named.host_refusal([(b"host", b"[fe80::1]:80")]) is None
    assert named.host_refusal([(b"host", b"SCORER.local:5005")]) is None
    assert serve_access.Access.local(TOKEN).host_refusal([]) == (
        400, "bad_host", "the request has no Host header")
    assert serve_access.Access.local(TOKEN).host_refusal([(b"host", b"a.example:1")]) == (
        421, "bad_host", "host 'a.example' is not one this server answers to; start serve "
                         "with --allowed-hosts a.example to allow it")


def test_the_refusals_of_a_post_name_what_to_send():
    from starlette.datastructures import Headers

    access = serve_access.Access.local(TOKEN)
    assert access.post_refusal(Headers({"content-type": "application/json"})) == (
        401, "unauthorized", "missing or wrong token: send 'Authorization: Bearer <token>' "
                             "(the token serve printed the place of)")
    authorized = {"authorization": f"bearer  {TOKEN}"}  # any case, more than one space
    assert access.post_refusal(Headers(authorized)) == (
        415, "unsupported_media_type", "content-type 'missing': expected application/json")
    assert access.post_refusal(Headers({**authorized, "content-type": "Text/Plain; a=b"})) \
        == (415, "unsupported_media_type", "content-type 'text/plain': expected "
                                            "application/json")
    assert access.post_refusal(Headers({**authorized, "content-type":
                                        "application/json; charset=utf-8"})) is None
    assert access.post_refusal(Headers({"content-type": "application/json"}),
                               token=False) is None
    assert not access.authorized(None) and not access.authorized(f"Basic {TOKEN}")


def test_resolve_keeps_the_options(tmp_path, monkeypatch):
    monkeypatch.setenv(serve_access.TOKEN_ENV, TOKEN)
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    access = serve_access.resolve(uri, 5123, "10.0.0.5", None, ("b.example",), True)
    assert access.require_token is True
    assert access.hosts == serve_access.LOCAL_HOSTS | {"10.0.0.5", "b.example"}
    access.forget()  # not serve's file: nothing to remove, nothing removed
    monkeypatch.setenv(serve_access.TOKEN_ENV, "x" * (serve_access.MIN_TOKEN_CHARS - 1))
    with pytest.raises(serve_access.AccessError) as refused:
        serve_access.resolve(uri, 5123, "127.0.0.1", None, (), False)
    assert str(refused.value) == (f"{serve_access.TOKEN_ENV}: expected a token of at least "
                                  f"16 characters without spaces")
    monkeypatch.setenv(serve_access.TOKEN_ENV, "x" * serve_access.MIN_TOKEN_CHARS)
    assert serve_access.resolve(uri, 5123, "127.0.0.1", None, (), False).token == "x" * 16
    monkeypatch.setenv(serve_access.TOKEN_ENV, "x" * 10 + " " + "x" * 10)
    with pytest.raises(serve_access.AccessError, match="without spaces"):
        serve_access.resolve(uri, 5123, "127.0.0.1", None, (), False)


def test_token_file_refusals_name_the_file(tmp_path):
    path = tmp_path / "token"
    path.write_text("short")
    path.chmod(0o600)
    with pytest.raises(serve_access.AccessError) as refused:
        serve_access.read_token_file(path)
    assert str(refused.value) == (f"--token-file {path}: expected a token of at least 16 "
                                  f"characters without spaces")
    with pytest.raises(serve_access.AccessError) as missing:
        serve_access.read_token_file(tmp_path / "missing")
    assert str(missing.value) == (f"--token-file {tmp_path / 'missing'}: cannot read it "
                                  f"(No such file or directory)")


def test_unknown_paths_and_methods_answer_in_the_error_shape(app_parts):
    """404 and 405 are JSON like every other refusal, and counted."""
    with _client(app_parts) as http:
        missing = http.get("/nowhere")
        assert missing.status_code == 404
        assert missing.json() == {"error": "GET /nowhere: Not Found", "reason": "not_found"}
        wrong = http.get("/invocations")
        assert wrong.status_code == 405
        assert wrong.json() == {"error": "GET /invocations: Method Not Allowed",
                                "reason": "method_not_allowed"}
        assert wrong.headers["allow"] == "POST"
        metrics = http.get("/metrics").text
    assert 'cord_serve_errors_total{reason="not_found"} 1.0' in metrics
    assert 'cord_serve_errors_total{reason="method_not_allowed"} 1.0' in metrics


def test_health_says_why_it_is_not_ready(app_parts):
    with _client(app_parts) as http:
        health = http.get("/health")
    assert health.status_code == 503
    assert health.json() == {"status": "not ready", "model": "m", "alias": "champion",
                             "reason": "loading the first version"}
