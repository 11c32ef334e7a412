"""MCP servers as tools for programs: a server config names a small MCP server (FastMCP,
stdio, started by sandcall); a program calls its tools; sandcall, as MCP client, calls
the server and hands the result back to the program without a round trip to the caller,
and the session's audit trail lists the call."""

from __future__ import annotations

import json
import secrets
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, Tuple

import pytest

from conftest import HERE, serve, server_env, wait_listening


@pytest.fixture(scope="module")
def weather() -> Iterator[Tuple[str, str, Path]]:
    """A server whose config names the MCP server `weather`: (base URL, API key, the
    file where the MCP server records each call it answers)."""
    work = Path(tempfile.mkdtemp(prefix="sandcall-mcp-client-"))
    calls = work / "calls.jsonl"
    calls.touch()
    config = work / "sandcall.toml"
    config.write_text(
        "[[mcp_servers]]\n"
        'name = "weather"\n'
        f"command = {json.dumps(sys.executable)}\n"
        f"args = [{json.dumps(str(HERE / 'weather_server.py'))}]\n"
        f"env = {{ WEATHER_CALLS = {json.dumps(str(calls))} }}\n"
        "[[mcp_servers]]\n"
        'name = "missing"\n'
        'command = "/nonexistent/mcp-server"\n'
    )
    key = "mcp-" + secrets.token_hex(16)
    env = server_env({"SANDCALL_API_KEYS": f"mcp:{key}"})
    for process in serve(work, ["--config", str(config)], env):
        yield wait_listening(process, work / "server.log"), key, calls
    shutil.rmtree(work, ignore_errors=True)


def request(base: str, key: str, method: str, path: str, body: Any = None) -> Tuple[int, Dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        base + path, data=data, method=method, headers={"X-API-Key": key, "Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


FORECAST = {
    "name": "forecast",
    "mcp_server": "weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}


def test_a_program_calls_an_mcp_servers_tool_without_the_caller(weather: Tuple[str, str, Path]) -> None:
    base, key, calls = weather
    code = (
        "r = forecast(city='Oslo', days=3)\n"
        "print(r['city'], sum(r['temperatures']))\n"
        "try:\n"
        "    broken(why='testing')\n"
        "except ToolError as e:\n"
        "    print('error:', e)\n"
    )
    broken = {"name": "broken", "mcp_server": "weather"}
    status, body = request(base, key, "POST", "/v1/exec/programmatic", {"code": code, "tools": [FORECAST, broken]})
    assert status == 200, body
    # No pause: the caller never saw a call.
    assert body["status"] == "completed", body
    lines = body["stdout"].splitlines()
    assert lines[0] == "Oslo 63"
    assert lines[1].startswith("error: ") and "broken on purpose: testing" in lines[1]
    # The MCP server answered both.
    made = [json.loads(line) for line in calls.read_text().splitlines()]
    assert made[-2:] == [
        {"tool": "forecast", "arguments": {"city": "Oslo", "days": 3}},
        {"tool": "broken", "arguments": {"why": "testing"}},
    ]
    # The audit trail lists both, as sent to the MCP server and answered.
    status, audit = request(base, key, "GET", f"/v1/exec/programmatic/{body['session_id']}/calls")
    assert status == 200, audit
    listed = audit["calls"]
    assert [c["name"] for c in listed] == ["forecast", "broken"]
    for call in listed:
        assert call["mcp_server"] == "weather"
        assert call["call_id"]
        assert call["outcome"]["status"] == "answered"
    assert listed[0]["outcome"]["is_error"] is False
    assert listed[1]["outcome"]["is_error"] is True


def test_mcp_tools_and_the_callers_tools_mix(weather: Tuple[str, str, Path]) -> None:
    base, key, _ = weather
    code = "r = forecast(city='Rome')\nprint(r['temperatures'][0] + convert(c=1))\n"
    convert = {"name": "convert", "parameters": {"type": "object", "properties": {"c": {"type": "number"}}}}
    status, body = request(base, key, "POST", "/v1/exec/programmatic", {"code": code, "tools": [FORECAST, convert]})
    assert status == 200, body
    # Only the caller's own tool comes to the caller.
    assert body["status"] == "tool_call_required", body
    [call] = body["tool_calls"]
    assert call["name"] == "convert"
    resume = {
        "continuation_token": body["continuation_token"],
        "tool_results": [{"call_id": call["id"], "result": 100}],
    }
    status, body = request(base, key, "POST", "/v1/exec/programmatic", resume)
    assert status == 200, body
    assert body["status"] == "completed", body
    assert body["stdout"] == "120\n"


def test_an_unknown_mcp_server_is_refused(weather: Tuple[str, str, Path]) -> None:
    base, key, _ = weather
    tool = dict(FORECAST, mcp_server="nowhere")
    status, body = request(base, key, "POST", "/v1/exec/programmatic", {"code": "print(1)", "tools": [tool]})
    assert status == 400
    assert body["error_type"] == "invalid_request"
    assert "nowhere" in body["error"]


def test_all_of_a_servers_tools_by_mcp_servers(weather: Tuple[str, str, Path]) -> None:
    base, key, calls = weather
    # Declared as the server lists them: positional arguments follow its schema.
    code = "print(forecast('Lima', 2)['temperatures'])"
    status, body = request(base, key, "POST", "/v1/exec/programmatic", {"code": code, "mcp_servers": ["weather"]})
    assert status == 200, body
    assert body["status"] == "completed", body
    assert body["stdout"] == "[20, 21]\n"
    assert json.loads(calls.read_text().splitlines()[-1]) == {"tool": "forecast", "arguments": {"city": "Lima", "days": 2}}
    # Arguments off the listed schema are refused before the server sees them.
    code = "try:\n    forecast(days='x')\nexcept ToolError as e:\n    print('refused:', e)"
    status, body = request(base, key, "POST", "/v1/exec/programmatic", {"code": code, "mcp_servers": ["weather"]})
    assert status == 200, body
    assert body["stdout"].startswith("refused: "), body


def test_a_server_that_cannot_start(weather: Tuple[str, str, Path]) -> None:
    base, key, _ = weather
    status, body = request(base, key, "POST", "/v1/exec/programmatic", {"code": "print(1)", "mcp_servers": ["missing"]})
    assert status == 502, body
    assert body["error_type"] == "mcp_server_failure"
    assert "missing" in body["error"] and "/nonexistent" not in body["error"]
    status, body = request(base, key, "POST", "/v1/exec/programmatic", {"code": "print(1)", "mcp_servers": ["nowhere"]})
    assert status == 400 and body["error_type"] == "invalid_request"
    # A declared tool of that server: the program gets the failure as a tool error.
    code = "try:\n    ping()\nexcept ToolError as e:\n    print('error:', e)"
    tool = {"name": "ping", "mcp_server": "missing"}
    status, body = request(base, key, "POST", "/v1/exec/programmatic", {"code": code, "tools": [tool]})
    assert status == 200, body
    assert body["status"] == "completed", body
    assert body["stdout"].startswith("error: ") and "missing" in body["stdout"], body
