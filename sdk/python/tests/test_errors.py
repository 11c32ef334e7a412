"""Typed errors: what the API refused, with its status, error and error_type."""

from __future__ import annotations

import pytest

from sandcall import APIError, Sandcall, SandcallError, TransportError


def test_bad_input_raises_an_api_error_with_the_servers_fields(client: Sandcall) -> None:
    with pytest.raises(APIError) as refused:
        client.exec("print(1)", language="cobol")
    error = refused.value
    assert isinstance(error, SandcallError)
    assert error.status_code == 400
    assert error.error_type == "unsupported_language"
    assert error.code == "unsupported_capability"
    assert "cobol" in error.error
    assert str(error).startswith("400 unsupported_language: ")

    with pytest.raises(APIError) as refused:
        client.run("print(1)", tools=[({"name": "bad", "parameters": {"type": 5}}, print)])
    assert (refused.value.status_code, refused.value.error_type) == (400, "invalid_tool_schema")

    with pytest.raises(APIError) as refused:
        client.exec("   ")
    assert (refused.value.status_code, refused.value.error_type) == (400, "invalid_request")

    with pytest.raises(APIError) as refused:
        client.session("AAAAAAAAAAAAAAAAAAAAA")
    assert (refused.value.status_code, refused.value.error_type) == (404, "session_not_found")


def test_a_wrong_key_is_unauthorized(server) -> None:
    with Sandcall(server.base_url, api_key="sdk-not-the-key-at-all") as sc:
        with pytest.raises(APIError) as refused:
            sc.exec("print(1)")
    assert (refused.value.status_code, refused.value.error_type) == (401, "unauthorized")


def test_bad_arguments_are_refused_before_any_request(client: Sandcall) -> None:
    with pytest.raises(ValueError, match="timeout"):
        client.exec("print(1)", timeout=0)
    with pytest.raises(TypeError, match="positional-only"):

        def f(a, /):  # noqa: E999 - Python 3.8+ syntax
            return a

        client.run("f(1)", tools=[f])


def test_no_server_is_a_transport_error() -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Sandcall(f"http://127.0.0.1:{port}", max_retries=1, retry_backoff=0.01) as sc:
        with pytest.raises(TransportError):
            sc.health()
