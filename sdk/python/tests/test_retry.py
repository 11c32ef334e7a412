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


def test_a_start_refused_with_429_is_sent_again_after_retry_after(one_session_server) -> None:
    import threading
    import time

    from sandcall import APIError

    server = one_session_server
    release = threading.Event()

    def hold() -> str:
        release.wait(30)
        return "released"

    with Sandcall(server.base_url, api_key=server.api_key, max_retries=0) as impatient, Sandcall(
        server.base_url, api_key=server.api_key
    ) as patient:
        # The principal's one session, paused in `hold` until released.
        first = threading.Thread(target=lambda: impatient.run("print(hold())", tools=[hold]))
        first.start()
        deadline = time.monotonic() + 30
        # A tenant's health shows its own figures: its sessions alive here.
        while impatient.health()["sessions"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        # Without retries, a second session is refused at once.
        try:
            impatient.run("print(1)")
        except APIError as e:
            assert (e.status_code, e.error_type, e.retry_after) == (429, "principal_at_capacity", 1.0)
        else:
            raise AssertionError("the second session was not refused")
        # With them, it waits as Retry-After says, and starts once the first has ended.
        threading.Timer(1.5, release.set).start()
        started = time.monotonic()
        result = patient.run("print('second')")
        first.join(30)
    assert result.stdout == "second\n", result
    assert time.monotonic() - started >= 1.0
