"""The credential of the Prefect servers cord-ops starts and the owner-only files around it
(flows/platform/credential.py): real folders, modes under a permissive
umask, a second account's folder and a planted link, Prefect's own client for the header,
and a real temporary server that refuses a request without the credential."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

import pytest
import second_user

from flows.platform import credential


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_the_state_folder_is_made_0700_and_an_older_open_one_is_tightened(tmp_path):
    with umask(0):
        made = credential.private_folder(tmp_path / "work" / "store" / "prefect")
    assert made == tmp_path / "work" / "store" / "prefect" and mode(made) == 0o700
    older = tmp_path / "older"
    older.mkdir()
    older.chmod(0o755)  # a folder any account may list, as an older cord-ops made
    assert mode(credential.private_folder(older)) == 0o700


def test_a_state_folder_that_is_a_link_a_file_or_another_users_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "link").symlink_to(elsewhere)
    with pytest.raises(credential.StateFolderError, match="link/?: the state folder must be "
                                                          "a folder of this user .* a link"):
        credential.private_folder(tmp_path / "link")
    (tmp_path / "file").write_text("")
    with pytest.raises(credential.StateFolderError, match="it is not a folder"):
        credential.private_folder(tmp_path / "file")
    reason = second_user.skip_reason()
    if reason is not None:
        pytest.skip(f"the other account's folder: {reason}")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    theirs.chmod(0o777)
    os.chown(theirs, second_user.NOBODY, second_user.NOBODY)
    with pytest.raises(credential.StateFolderError,
                       match=f"it is owned by uid {second_user.NOBODY}"):
        credential.private_folder(theirs)
    assert mode(theirs) == 0o777  # left as it was


def test_private_files_are_0600_from_their_creation_whatever_the_umask(tmp_path):
    with umask(0):
        written = credential.write_private(tmp_path / "server.json", "{}\n")
        with credential.open_private(tmp_path / "server.log") as log:
            log.write(b"line\n")
    assert written.read_text() == "{}\n" and mode(written) == 0o600
    assert mode(tmp_path / "server.log") == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    # replaced, not written through: a link planted at the path does not lead elsewhere
    victim = tmp_path / "victim"
    victim.write_text("theirs")
    (tmp_path / "planted.json").symlink_to(victim)
    credential.write_private(tmp_path / "planted.json", "mine")
    assert victim.read_text() == "theirs"
    assert not (tmp_path / "planted.json").is_symlink() and mode(tmp_path / "planted.json") \
        == 0o600
    (tmp_path / "planted.log").symlink_to(victim)
    with pytest.raises(OSError):
        credential.open_private(tmp_path / "planted.log")
    assert victim.read_text() == "theirs"


def test_a_file_planted_at_the_temporary_name_is_never_written_through(tmp_path,
                                                                       monkeypatch):
    """The temporary name is random; were it guessed, a link or file put there first must
    make the write fail, not be written through or reused."""
    monkeypatch.setattr(credential.secrets, "token_hex", lambda n: "guessed")
    victim = tmp_path / "victim"
    victim.write_text("theirs")
    planted = tmp_path / f".server.json.{os.getpid()}.guessed.tmp"
    planted.symlink_to(victim)
    with pytest.raises(FileExistsError):
        credential.write_private(tmp_path / "server.json", "mine")
    assert victim.read_text() == "theirs" and not (tmp_path / "server.json").exists()


def test_the_credential_is_new_at_each_call_and_kept_owner_only(tmp_path):
    first, second = credential.new(), credential.new()
    assert first != second
    user, password = first.split(":", 1)
    assert user == "cord-ops" and len(password) == 43  # 256 random bits, URL-safe base64
    folder = credential.private_folder(tmp_path / "prefect")
    assert credential.load(folder) is None
    credential.auth_file(folder).write_text("\n")
    assert credential.load(folder) is None  # empty: no credential
    with umask(0):
        path = credential.save(folder, first)
    assert path == folder / "api-auth" and mode(path) == 0o600
    assert credential.load(folder) == first


def test_the_header_is_the_one_prefects_own_client_sends():
    from prefect.client.orchestration import SyncPrefectClient

    client = SyncPrefectClient("http://127.0.0.1:9/api", auth_string="cord-ops:pass word")
    try:
        sent = client._client.headers["Authorization"]
    finally:
        client._client.close()
    assert credential.authorization("cord-ops:pass word") == {"Authorization": sent}


@pytest.mark.slow
def test_a_temporary_server_refuses_whoever_lacks_its_credential(tmp_path, monkeypatch):
    """A command's temporary server listens on 127.0.0.1 while the command runs: any local
    account reaches it. Without the credential only its health check answers; this
    command's Prefect client, which got the credential through the settings context,
    is served."""
    import httpx
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    from flows.platform import prefect_api, temporary_server

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("PREFECT_API_AUTH_STRING", raising=False)
    with temporary_settings(updates={PREFECT_HOME: str(tmp_path / "home"),
                                     PREFECT_API_URL: None}):
        with temporary_server.temporary_api(timeout=120):
            url = PREFECT_API_URL.value()
            assert httpx.get(f"{url}/health", timeout=30).status_code == 200
            for method, path in (("POST", "/flows/filter"), ("POST", "/flow_runs/filter"),
                                 ("POST", "/flows/")):
                answer = httpx.request(method, f"{url}{path}", json={"name": "intruder"},
                                       timeout=30)
                assert answer.status_code == 401, (path, answer.text)
            # (the server's database may be shared with earlier tests: write, then read)
            with get_client(sync_client=True) as client:
                flow_id = client.create_flow_from_name("served-with-the-credential")
                assert client.read_flow(flow_id).name == "served-with-the-credential"
            # what a process this command starts gets (the reproduction's Dask workers)
            given = prefect_api.api_environment()
            assert set(given) == {"PREFECT_API_URL", "PREFECT_API_AUTH_STRING"}
            assert given["PREFECT_API_URL"] == url
            answer = httpx.post(f"{url}/flows/filter", json={}, timeout=30, headers=(
                credential.authorization(given["PREFECT_API_AUTH_STRING"])))
            assert answer.status_code == 200, answer.text
