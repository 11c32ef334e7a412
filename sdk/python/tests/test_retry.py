"""A resume whose answer was lost in transit is sent again, as api.md allows, and the run
ends with the right result, each tool run once."""

from __future__ import annotations

import asyncio

from sandcall import AsyncSandcall, Sandcall

PROGRAM = "\n".join(
    [
        "a = charge(amount=5)",
        "b = charge(amount=7)",
        "print(a, b)",
    ]
)


def test_a_dropped_resume_is_retried_once_and_gives_the_right_result(server, dropping_proxy) -> None:
    charged = []

    def charge(amount: int) -> str:
        charged.append(amount)
        return f"charged {amount}"

    with Sandcall(dropping_proxy.base_url, api_key=server.api_key, retry_backoff=0.01) as sc:
        result = sc.run(PROGRAM, tools=[charge])
    assert result.stdout == "charged 5 charged 7\n", result
    # The server answered the first resume, the proxy threw that answer away, and the SDK
    # sent the same resume again: one more resume than pauses, and every tool ran once.
    assert dropping_proxy.dropped == 1
    assert dropping_proxy.resumes == result.pauses + 1 == 3
    assert charged == [5, 7]
    assert [c.result for c in result.tool_calls] == ["charged 5", "charged 7"]


def test_the_async_client_retries_a_dropped_resume_too(server, dropping_proxy) -> None:
    charged = []

    async def charge(amount: int) -> str:
        charged.append(amount)
        return f"charged {amount}"

    async def main():
        async with AsyncSandcall(dropping_proxy.base_url, api_key=server.api_key, retry_backoff=0.01) as sc:
            return await sc.run(PROGRAM, tools=[charge])

    result = asyncio.run(main())
    assert result.stdout == "charged 5 charged 7\n", result
    assert dropping_proxy.dropped == 1 and dropping_proxy.resumes == 3
    assert charged == [5, 7]
