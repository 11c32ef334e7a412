"""sandcall as an MCP server: a real MCP client lists its tools and calls them, over
stdio (`sandcall mcp`) and over streamable HTTP (`/mcp`)."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from typing import Any, Dict

import anyio

from conftest import Connect, Server


def call(connect: Connect, name: str, arguments: Dict[str, Any]) -> Any:
    async def go() -> Any:
        async with connect() as session:
            return await session.call_tool(name, arguments)

    return anyio.run(go)


def ok(result: Any) -> Dict[str, Any]:
    assert not result.isError, result.content
    assert result.structuredContent is not None
    # The text is the same JSON, for clients that read only text.
    assert json.loads(result.content[0].text) == result.structuredContent
    return result.structuredContent


def test_lists_the_tools_with_their_schemas(connect: Connect) -> None:
    async def go() -> Any:
        async with connect() as session:
            return (await session.list_tools()).tools

    tools = {t.name: t for t in anyio.run(go)}
    assert set(tools) == {"execute_code", "upload_file", "list_files", "download_file"}
    exec_schema = tools["execute_code"].inputSchema
    assert exec_schema["type"] == "object"
    assert sorted(exec_schema["required"]) == ["code", "language"]
    assert set(exec_schema["properties"]) == {"language", "code", "files", "timeout_ms", "stdin"}
    assert exec_schema["properties"]["code"]["type"] == "string"
    assert tools["upload_file"].inputSchema["required"] == ["name"]
    assert set(tools["upload_file"].inputSchema["properties"]) == {"name", "text", "base64"}
    assert tools["list_files"].inputSchema["required"] == ["session_id"]
    assert sorted(tools["download_file"].inputSchema["required"]) == ["file_id", "session_id"]
    for tool in tools.values():
        assert tool.description


def test_runs_python_and_returns_its_output(connect: Connect) -> None:
    out = ok(
        call(
            connect,
            "execute_code",
            {
                "language": "python",
                "code": "import sys\nprint(6 * 7)\nprint('oops', file=sys.stderr)\nopen('out.txt', 'w').write('hi')",
            },
        )
    )
    assert out["stdout"] == "42\n"
    assert "oops" in out["stderr"]
    assert out["exit_code"] == 0
    assert out["status"] == "ok"
    [written] = out["files"]
    assert written["name"] == "out.txt"
    assert written["download_path"] == f"/v1/download/{written['session_id']}/{written['id']}"
    # What a run wrote can be read back, and listed.
    got = ok(call(connect, "download_file", {"session_id": written["session_id"], "file_id": written["id"]}))
    assert got["text"] == "hi"
    listed = ok(call(connect, "list_files", {"session_id": written["session_id"]}))
    assert [f["id"] for f in listed["files"]] == [written["id"]]


def test_a_failing_program_is_a_result_not_an_error(connect: Connect) -> None:
    out = ok(call(connect, "execute_code", {"language": "bash", "code": "echo no >&2; exit 3"}))
    assert out["exit_code"] == 3
    assert out["stderr"] == "no\n"


def test_upload_then_a_program_reads_it(connect: Connect) -> None:
    up = ok(call(connect, "upload_file", {"name": "data.csv", "text": "a,b\n1,2\n3,4\n"}))
    assert up["name"] == "data.csv" and up["size"] == 12
    code = "import csv\nrows = list(csv.DictReader(open('data.csv')))\nprint(sum(int(r['b']) for r in rows))"
    out = ok(
        call(
            connect,
            "execute_code",
            {"language": "python", "code": code, "files": [{"id": up["id"], "session_id": up["session_id"]}]},
        )
    )
    assert out["stdout"] == "6\n"
    # Binary content goes in and comes back as base64.
    blob = bytes(range(256))
    up = ok(call(connect, "upload_file", {"name": "blob.bin", "base64": base64.b64encode(blob).decode()}))
    got = ok(call(connect, "download_file", {"session_id": up["session_id"], "file_id": up["id"]}))
    assert base64.b64decode(got["base64"]) == blob
    assert "text" not in got


def test_a_bad_language_is_a_tool_error_with_the_api_message(connect: Connect) -> None:
    result = call(connect, "execute_code", {"language": "cobol", "code": "DISPLAY 'HI'."})
    assert result.isError
    body = result.structuredContent
    assert body["error_type"] == "unsupported_language"
    assert "cobol" in body["error"]


def test_bad_arguments_are_tool_errors(connect: Connect) -> None:
    both = call(connect, "upload_file", {"name": "x.txt", "text": "a", "base64": "YQ=="})
    assert both.isError
    assert both.structuredContent["error_type"] == "invalid_request"
    missing = call(connect, "download_file", {"session_id": "nope", "file_id": "nope"})
    assert missing.isError
    assert missing.structuredContent["error_type"] == "file_not_found"


def test_mcp_over_http_needs_the_api_key(http_server: Server) -> None:
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
        }
    ).encode()
    request = urllib.request.Request(
        http_server.base_url + "/mcp",
        data=body,
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream"},
    )
    try:
        urllib.request.urlopen(request, timeout=30)
        raise AssertionError("an unauthenticated MCP request was served")
    except urllib.error.HTTPError as e:
        assert e.code == 401
        assert json.loads(e.read())["error_type"] == "unauthorized"


def test_over_http_each_key_sees_only_its_own_files(http_server: Server) -> None:
    import contextlib

    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    def as_key(key: str) -> Connect:
        @contextlib.asynccontextmanager
        async def connect() -> Any:
            http = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
            async with http, streamable_http_client(http_server.base_url + "/mcp", http_client=http) as (r, w, _):
                async with ClientSession(r, w) as session:
                    await session.initialize()
                    yield session

        return connect

    mine, theirs = as_key(http_server.api_key), as_key(http_server.other_key)
    up = ok(call(mine, "upload_file", {"name": "secret.txt", "text": "mine"}))
    got = call(theirs, "download_file", {"session_id": up["session_id"], "file_id": up["id"]})
    assert got.isError and got.structuredContent["error_type"] == "file_not_found"
    assert ok(call(theirs, "list_files", {"session_id": up["session_id"]}))["files"] == []
    ran = call(
        theirs,
        "execute_code",
        {"language": "bash", "code": "cat secret.txt", "files": [{"id": up["id"], "session_id": up["session_id"]}]},
    )
    assert ran.isError and ran.structuredContent["error_type"] == "file_not_found"
    assert ok(call(mine, "download_file", {"session_id": up["session_id"], "file_id": up["id"]}))["text"] == "mine"


def test_the_file_tools_count_against_the_file_routes_rate(limited_server: Server) -> None:
    import contextlib

    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    @contextlib.asynccontextmanager
    async def connect() -> Any:
        http = create_mcp_http_client(headers={"X-API-Key": limited_server.api_key})
        async with http, streamable_http_client(limited_server.base_url + "/mcp", http_client=http) as (r, w, _):
            async with ClientSession(r, w) as session:
                await session.initialize()
                yield session

    for _ in range(2):
        ok(call(connect, "list_files", {"session_id": "x"}))
    refused = call(connect, "list_files", {"session_id": "x"})
    assert refused.isError
    assert refused.structuredContent["error_type"] == "rate_limited"
    assert refused.structuredContent["retry_after_seconds"] >= 1
    # Running code is another group, not limited here.
    assert ok(call(connect, "execute_code", {"language": "bash", "code": "echo hi"}))["stdout"] == "hi\n"
