"""What the MCP tests start: the built sandcall binary (``SANDCALL_BINARY``, else
``target/debug/sandcall`` of this checkout), as root (it builds real sandboxes), each
with its own data directory; and MCP client sessions to it (the official ``mcp``
package) over stdio (``sandcall mcp``) and over streamable HTTP (``/mcp`` of
``sandcall serve``, with an API key)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import AsyncIterator, Callable, Dict, Iterator, List, Optional

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent


def binary() -> Path:
    path = Path(os.environ.get("SANDCALL_BINARY", ROOT / "target" / "debug" / "sandcall"))
    if not path.is_file():
        pytest.exit(f"no sandcall binary at {path}: build it (cargo build) or set SANDCALL_BINARY", returncode=2)
    if os.geteuid() != 0:
        pytest.exit("the MCP tests start a real sandcall, which builds sandboxes and needs root", returncode=2)
    return path


def server_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDCALL_") or k == "SANDCALL_RUNTIME_DIR"}
    env.update(
        {
            "SANDCALL_LOG": "warn",
            "SANDCALL_INSTALL_RUNTIME": "false",
            "SANDCALL_RUNTIME_DIR": os.environ.get("SANDCALL_RUNTIME_DIR", str(ROOT / "target" / "runtimes")),
            "SANDCALL_WARM_POOL_SIZE": "0",
        }
    )
    env.update(extra or {})
    return env


class Server:
    def __init__(self, base_url: str, api_key: str, log: Path) -> None:
        self.base_url = base_url
        self.api_key = api_key
        self.log = log
        # A second principal's key.
        self.other_key = ""


def serve(work: Path, args: List[str], env: Dict[str, str]) -> Iterator[subprocess.Popen]:
    log = work / "server.log"
    with open(log, "wb") as log_file:
        process = subprocess.Popen(
            [str(binary()), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(work / "data"), *args],
            stdout=subprocess.PIPE,
            stderr=log_file,
            env=env,
        )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_listening(process: subprocess.Popen, log: Path) -> str:
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


@pytest.fixture(scope="session")
def http_server() -> Iterator[Server]:
    """`sandcall serve` with an API key, whose `/mcp` the HTTP tests use."""
    work = Path(tempfile.mkdtemp(prefix="sandcall-mcp-"))
    key = "mcp-" + secrets.token_hex(16)
    other = "other-" + secrets.token_hex(16)
    keys = f"mcp:{key},other:{other}"
    for process in serve(work, [], server_env({"SANDCALL_API_KEYS": keys})):
        server = Server(wait_listening(process, work / "server.log"), key, work / "server.log")
        server.other_key = other
        yield server
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def limited_server() -> Iterator[Server]:
    """`sandcall serve` whose file routes allow a principal 2 requests a minute."""
    work = Path(tempfile.mkdtemp(prefix="sandcall-mcp-limited-"))
    key = "mcp-" + secrets.token_hex(16)
    env = server_env({"SANDCALL_API_KEYS": f"mcp:{key}", "SANDCALL_RATE_LIMIT_FILES": "2/min"})
    for process in serve(work, [], env):
        yield Server(wait_listening(process, work / "server.log"), key, work / "server.log")
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def stdio_work() -> Iterator[Path]:
    work = Path(tempfile.mkdtemp(prefix="sandcall-mcp-stdio-"))
    yield work
    shutil.rmtree(work, ignore_errors=True)


Connect = Callable[[], "contextlib.AbstractAsyncContextManager[ClientSession]"]


@pytest.fixture(params=["stdio", "http"])
def connect(request: pytest.FixtureRequest) -> Connect:
    """Opens an initialized MCP client session over the transport of the test's param."""
    if request.param == "stdio":
        work: Path = request.getfixturevalue("stdio_work")

        @contextlib.asynccontextmanager
        async def over_stdio() -> AsyncIterator[ClientSession]:
            params = StdioServerParameters(
                command=str(binary()),
                args=["mcp", "--data-dir", str(work / "data")],
                env=server_env(),
            )
            with open(work / "stdio.log", "ab") as errlog:
                async with stdio_client(params, errlog=errlog) as (read, write):
                    async with ClientSession(read, write) as session:
                        await session.initialize()
                        yield session

        return over_stdio

    server: Server = request.getfixturevalue("http_server")

    @contextlib.asynccontextmanager
    async def over_http() -> AsyncIterator[ClientSession]:
        http = create_mcp_http_client(headers={"X-API-Key": server.api_key})
        async with http, streamable_http_client(server.base_url + "/mcp", http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session

    return over_http
