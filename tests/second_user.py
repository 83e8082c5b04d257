"""A second local account in tests: probes run as uid/gid 65534 (``nobody``), with no
supplementary groups, as another user on the machine would. The test process must be root to switch;
elsewhere the tests that need it skip with the reason.

A probe is a plain function run in a child forked from the test process (so no interpreter
or virtual environment has to be reachable by that account); it returns something JSON can
carry. Probes use the standard library only, and no thread of the parent exists in the
child.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import socket
import struct
import time

import pytest

NOBODY = 65534


def skip_reason() -> str | None:
    """Why this process cannot run a probe as another account, or None."""
    if not hasattr(os, "fork") or not hasattr(os, "setuid"):
        return "no fork/setuid on this system"
    if os.geteuid() != 0:
        return f"switching to uid {NOBODY} needs root; this test runs as uid {os.geteuid()}"
    return None


def as_second_user(probe, *args, timeout: float = 60.0, gid: int = NOBODY):
    """``probe(*args)`` run as uid 65534 and group ``gid`` (65534 unless told); its result,
    or a failure naming the child's exception."""
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(NOBODY)
            message = {"result": probe(*args)}
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            message = {"error": f"{type(exc).__name__}: {exc}"}
            code = 1
        try:
            data = json.dumps(message).encode()
            while data:
                data = data[os.write(write_end, data):]
        finally:
            os._exit(code)
    os.close(write_end)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                os.kill(pid, 9)
                pytest.fail(f"the probe as uid {NOBODY} did not finish within {timeout} s")
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    message = json.loads(b"".join(chunks) or b"{}")
    if "result" not in message:
        pytest.fail(f"the probe as uid {NOBODY} failed: {message.get('error', 'no output')}")
    return message["result"]


# ---------------------------------------------------------------- probes
def open_each(paths: list[str]) -> dict[str, str]:
    """For each path: "read" when its first byte could be read, else the error's type."""
    found = {}
    for path in paths:
        try:
            with open(path, "rb") as handle:
                handle.read(1)
            found[path] = "read"
        except OSError as exc:
            found[path] = type(exc).__name__
    return found


def http_request(port: int, method: str, path: str, body: dict | None = None,
                 headers: dict | None = None) -> tuple[int, object]:
    """(status, JSON body or None) of one request to 127.0.0.1:``port``."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        payload = None if body is None else json.dumps(body)
        connection.request(method, path, body=payload, headers={
            "Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        raw = response.read()
        try:
            return response.status, json.loads(raw)
        except ValueError:
            return response.status, None
    finally:
        connection.close()


def unix_request(path: str, payload: bytes, with_fds: bool = True,
                 timeout: float = 30.0) -> dict:
    """Connect to the Unix socket ``path``, send ``payload`` framed as the warm runner's
    messages are (4-byte length, then the bytes; three descriptors of /dev/null with it),
    and return ``{"connect": error or None, "reply": the first message back or None}``."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    fds = [os.open(os.devnull, os.O_RDWR) for _ in range(3)] if with_fds else []
    try:
        try:
            sock.connect(path)
        except OSError as exc:
            return {"connect": type(exc).__name__, "reply": None}
        head = struct.pack("!I", len(payload))
        try:
            if fds:
                socket.send_fds(sock, [head], fds)
                sock.sendall(payload)
            else:
                sock.sendall(head + payload)
        except OSError:
            pass  # refused before it read: the reply may still be waiting
        return {"connect": None, "reply": read_reply(sock)}
    finally:
        sock.close()
        for fd in fds:
            os.close(fd)


def read_reply(sock: socket.socket) -> dict | None:
    """One framed JSON message from ``sock``, or None at end of stream."""
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            if len(data) >= 4 and len(data) >= 4 + struct.unpack("!I", data[:4])[0]:
                break
    except OSError:
        pass
    if len(data) < 4:
        return None
    size = struct.unpack("!I", data[:4])[0]
    return json.loads(data[4:4 + size])
