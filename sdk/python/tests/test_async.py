"""The async client: async tools gathered in the event loop, plain ones in threads, errors,
files and exec, against the real server."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Awaitable, Callable, TypeVar

import pytest

from sandcall import APIError, AsyncFile, AsyncSandcall

T = TypeVar("T")


def run_with(server, body: Callable[[AsyncSandcall], Awaitable[T]]) -> T:
    async def main() -> T:
        async with AsyncSandcall(server.base_url, api_key=server.api_key) as sc:
            return await body(sc)

    return asyncio.run(main())


GATHER = "\n".join(
    [
        "async def main():",
        "    return await asyncio.gather(left(), right())",
        "print(asyncio.run(main()))",
    ]
)


def test_async_tools_of_one_pause_run_concurrently(server) -> None:
    async def body(sc: AsyncSandcall):
        # Each waits for the other's event: awaited one after the other, the first
        # would time out.
        left_ran, right_ran = asyncio.Event(), asyncio.Event()

        async def left() -> bool:
            left_ran.set()
            await asyncio.wait_for(right_ran.wait(), 10)
            return True

        async def right() -> bool:
            right_ran.set()
            await asyncio.wait_for(left_ran.wait(), 10)
            return True

        return await sc.run(GATHER, tools={"left": left, "right": right})

    result = run_with(server, body)
    assert result.stdout == "[True, True]\n", result
    assert result.pauses == 1 and len(result.tool_calls) == 2


def test_plain_tools_in_the_async_client_run_in_threads_without_blocking_the_loop(server) -> None:
    left_ran, right_ran = threading.Event(), threading.Event()

    def left() -> bool:
        left_ran.set()
        return right_ran.wait(10)

    def right() -> bool:
        right_ran.set()
        return left_ran.wait(10)

    async def body(sc: AsyncSandcall):
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        task = asyncio.ensure_future(ticker())
        started = time.monotonic()
        result = await sc.run(GATHER, tools={"left": left, "right": right})
        task.cancel()
        return result, ticks, time.monotonic() - started

    result, ticks, _ = run_with(server, body)
    assert result.stdout == "[True, True]\n", result
    assert ticks > 1


def test_async_tool_errors_become_is_error(server) -> None:
    async def lookup(key: str) -> str:
        raise KeyError(f"no key {key}")

    async def body(sc: AsyncSandcall):
        return await sc.run(
            "try:\n    lookup(key='k')\nexcept ToolError as e:\n    print('caught', e)", tools=[lookup]
        )

    result = run_with(server, body)
    assert result.stdout == "caught 'no key k'\n", result
    call = result.tool_calls[0]
    assert call.is_error and call.error_message == "'no key k'"


def test_async_files_exec_and_errors(server, tmp_path) -> None:
    async def body(sc: AsyncSandcall):
        local = tmp_path / "big.bin"
        local.write_bytes(b"y" * (2 << 20))
        [big] = await sc.upload(local)  # streamed from disk
        assert big.size == 2 << 20 and await big.download() == local.read_bytes()
        stored = await sc.upload({"in.txt": "abc"})
        result = await sc.exec("open('out.txt', 'w').write(open('in.txt').read().upper())", files=stored)
        out = [f for f in result.files if f.name == "out.txt"][0]
        assert isinstance(out, AsyncFile)
        data = await out.download()
        saved = await out.save(tmp_path)
        listed = await sc.files(result.session_id)
        await sc.delete_file(out)
        with pytest.raises(APIError) as refused:
            await sc.download(out)
        with pytest.raises(APIError) as bad:
            await sc.run("print(1)", language="cobol")
        return result, data, saved, listed, refused.value, bad.value

    result, data, saved, listed, refused, bad = run_with(server, body)
    assert result.status == "ok", result.stderr
    assert data == b"ABC" and saved.read_bytes() == b"ABC"
    assert [f.name for f in listed] == ["out.txt"]
    assert (refused.status_code, refused.error_type) == (404, "file_not_found")
    assert (bad.status_code, bad.error_type, bad.code) == (400, "unsupported_language", "unsupported_capability")


def test_a_cancelled_run_cancels_its_session(server) -> None:
    import httpx

    seen = {}

    async def remember(response: httpx.Response) -> None:
        if response.request.url.path.endswith("/programmatic") and response.status_code == 200:
            await response.aread()
            seen.setdefault("session_id", response.json().get("session_id"))

    async def main() -> Any:
        http = httpx.AsyncClient(event_hooks={"response": [remember]})
        async with AsyncSandcall(server.base_url, api_key=server.api_key, http_client=http) as sc:
            started = asyncio.Event()

            async def wait_forever() -> None:
                started.set()
                await asyncio.sleep(3600)

            task = asyncio.ensure_future(sc.run("wait_forever()\nprint('never')", tools=[wait_forever]))
            await asyncio.wait_for(started.wait(), 60)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            state = await sc.session(seen["session_id"])
        await http.aclose()
        return state

    state = asyncio.run(main())
    assert state["status"] == "error", state
    assert state["error_type"] == "cancelled"


def test_an_async_tool_slower_than_the_pause_gets_the_program_a_timeout(short_pause_server) -> None:
    async def slow() -> str:
        await asyncio.sleep(2)  # the server's pause ends after 1 s
        return "too late"

    # The program runs on for 2 s after the timeout (at 1 s): the late resume (at 2 s)
    # finds it running, is refused, and the SDK waits for its end.
    code = "import time\ntry:\n    slow()\nexcept TimeoutError:\n    print('timed out')\ntime.sleep(2)\nprint('went on')"
    result = run_with(short_pause_server, lambda sc: sc.run(code, tools=[slow]))
    assert result.stdout == "timed out\nwent on\n", result
    assert [(c.result, c.delivered) for c in result.tool_calls] == [("too late", False)]
