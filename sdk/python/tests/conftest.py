"""A real sandcall server for the SDK's tests: the built binary (``SANDCALL_BINARY``, else
``target/debug/sandcall`` of this checkout) started once per session on a free loopback
port, with its own data directory and an API key, as root (it builds real sandboxes)."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

ROOT = Path(__file__).resolve().parents[3]


class Server:
    def __init__(self, base_url: str, api_key: str, process: subprocess.Popen, log: Path) -> None:
        self.base_url = base_url
        self.api_key = api_key
        self.process = process
        self.log = log

    @property
    def host_port(self) -> tuple:
        host, port = self.base_url.rsplit("//", 1)[1].rsplit(":", 1)
        return host, int(port)


def _binary() -> Path:
    binary = Path(os.environ.get("SANDCALL_BINARY", ROOT / "target" / "debug" / "sandcall"))
    if not binary.is_file():
        pytest.exit(f"no sandcall binary at {binary}: build it (cargo build) or set SANDCALL_BINARY", returncode=2)
    return binary


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """A server with an API key."""
    yield from _serve("sdk-" + secrets.token_hex(16))


@pytest.fixture(scope="session")
def local_server() -> Iterator[Server]:
    """A server in local mode (no keys), as the docs' examples expect."""
    yield from _serve(None)


@pytest.fixture(scope="session")
def one_session_server() -> Iterator[Server]:
    """A server where a principal holds at most one session at a time: a second start
    gets `429 principal_at_capacity` with Retry-After."""
    yield from _serve("sdk-" + secrets.token_hex(16), {"SANDCALL_MAX_SESSIONS_PER_PRINCIPAL": "1"})


@pytest.fixture(scope="session")
def short_pause_server() -> Iterator[Server]:
    """A server whose pauses end after 1 s without an answer (tool_call_timeout_ms)."""
    yield from _serve("sdk-" + secrets.token_hex(16), {"SANDCALL_TOOL_CALL_TIMEOUT_MS": "1000"})


def _serve(key: Optional[str], extra_env: Optional[Dict[str, str]] = None) -> Iterator[Server]:
    if os.geteuid() != 0:
        pytest.exit("the SDK's tests start a real sandcall server, which builds sandboxes and needs root", returncode=2)
    work = Path(tempfile.mkdtemp(prefix="sandcall-sdk-"))
    log = work / "server.log"
    env = {k: v for k, v in os.environ.items() if k not in ("SANDCALL_API_KEYS", "SANDCALL_API_KEY")}
    if key is not None:
        env["SANDCALL_API_KEYS"] = f"sdk:{key}"
    env.update(
        {
            "SANDCALL_LOG": "warn",
            "SANDCALL_INSTALL_RUNTIME": "false",
            "SANDCALL_RUNTIME_DIR": os.environ.get("SANDCALL_RUNTIME_DIR", str(ROOT / "target" / "runtimes")),
            "SANDCALL_WARM_POOL_SIZE": "2",
            "SANDCALL_WARM_LANGUAGES": '["python"]',
            "SANDCALL_WARM_PRELOAD_POOL_SIZE": "0",
        }
    )
    env.update(extra_env or {})
    with open(log, "wb") as log_file:
        process = subprocess.Popen(
            [str(_binary()), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(work / "data")],
            stdout=subprocess.PIPE,
            stderr=log_file,
            env=env,
        )
    base_url = _wait_listening(process, log)
    yield Server(base_url, key or "", process, log)
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    shutil.rmtree(work, ignore_errors=True)


def _wait_listening(process: subprocess.Popen, log: Path) -> str:
    """The URL the server prints once it listens (``sandcall listening on URL``)."""
    found: List[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in iter(process.stdout.readline, b""):
            text = line.decode(errors="replace").strip()
            if text.startswith("sandcall listening on ") and not found:
                found.append(text[len("sandcall listening on ") :])

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 120
    while not found:
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"sandcall serve did not start:\n{log.read_text(errors='replace')[-4000:]}")
        time.sleep(0.05)
    return found[0]


@pytest.fixture()
def client(server: Server) -> Iterator["object"]:
    from sandcall import Sandcall

    with Sandcall(server.base_url, api_key=server.api_key) as sc:
        yield sc


class DroppingProxy:
    """A loopback proxy in front of the server, one request per connection, that forwards
    every request but throws away the server's answer to the first ``drop`` resumes (the
    requests carrying a ``continuation_token``) and closes the connection instead: a
    resume that the server handled, whose answer was lost in transit."""

    def __init__(self, upstream: tuple, drop: int = 1) -> None:
        self.upstream = upstream
        self.to_drop = drop
        self.resumes = 0
        self.dropped = 0
        self.requests = 0
        self._lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.base_url = "http://127.0.0.1:%d" % self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            request = _read_request(conn)
            if request is None:
                return
            head, body = request
            lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
            forwarded = b"\r\n".join(lines) + b"\r\nConnection: close\r\n\r\n" + body
            with socket.create_connection(self.upstream) as up:
                up.sendall(forwarded)
                answer = _read_all(up)
            drop = False
            with self._lock:
                self.requests += 1
                if b'"continuation_token"' in body:
                    self.resumes += 1
                    if self.dropped < self.to_drop:
                        self.dropped += 1
                        drop = True
            if not drop:
                conn.sendall(answer)


def _read_request(conn: socket.socket) -> Optional[tuple]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        rest += chunk
    return head, rest


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


@pytest.fixture()
def dropping_proxy(server: Server) -> Iterator[DroppingProxy]:
    proxy = DroppingProxy(server.host_port)
    yield proxy
    proxy.close()
