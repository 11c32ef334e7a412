"""The sync client's tool loop against the real server."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import List

import httpx

from sandcall import Sandcall, Tool, tool


def test_a_plain_tool_is_declared_from_its_signature_and_answers_the_program(client: Sandcall) -> None:
    seen = []

    def add(a: int, b: int) -> int:
        """Adds two integers."""
        seen.append((a, b))
        return a + b

    code = "\n".join(
        [
            "print(add(a=2, b=3))",
            "print(add(4, 5))  # positional: the schema's order",
            "try:",
            "    add(a='two', b=3)",
            "except ToolError as e:",
            "    print('refused:', 'a' in str(e))",
            "try:",
            "    add(a=1, b=2, c=3)",
            "except ToolError as e:",
            "    print('refused extra')",
        ]
    )
    result = client.run(code, tools={"add": add})
    assert result.status == "completed", result
    assert result.ok
    assert result.stdout == "5\n9\nrefused: True\nrefused extra\n", result.stderr
    # The two calls that broke the derived schema never reached the callable.
    assert seen == [(2, 3), (4, 5)]
    assert [(c.name, c.arguments, c.result, c.is_error) for c in result.tool_calls] == [
        ("add", {"a": 2, "b": 3}, 5, False),
        ("add", {"a": 4, "b": 5}, 9, False),
    ]
    assert result.pauses == 2
    assert [c.pause for c in result.tool_calls] == [1, 2]
    assert result.raw["tool_calls_made"] == 2


def test_async_callables_work_in_the_sync_client(client: Sandcall) -> None:
    async def lookup(key: str) -> dict:
        await asyncio.sleep(0.01)
        return {"key": key, "value": len(key)}

    result = client.run("r = lookup(key='abcd')\nprint(r['value'], r['key'])", tools={"lookup": lookup})
    assert result.stdout == "4 abcd\n", result
    assert result.tool_calls[0].result == {"key": "abcd", "value": 4}


def test_gathered_calls_run_concurrently(client: Sandcall) -> None:
    # Each tool sets its own event and waits for the other's: run one after the other,
    # the first would wait in vain.
    left_ran, right_ran = threading.Event(), threading.Event()
    threads = set()

    def left() -> bool:
        threads.add(threading.get_ident())
        left_ran.set()
        return right_ran.wait(10)

    def right() -> bool:
        threads.add(threading.get_ident())
        right_ran.set()
        return left_ran.wait(10)

    code = "\n".join(
        [
            "async def main():",
            "    return await asyncio.gather(left(), right())",
            "print(asyncio.run(main()))",
        ]
    )
    result = client.run(code, tools={"left": left, "right": right})
    assert result.stdout == "[True, True]\n", result
    assert result.pauses == 1
    assert sorted(c.name for c in result.tool_calls) == ["left", "right"]
    assert {c.pause for c in result.tool_calls} == {1}
    assert len(threads) == 2


def test_a_tool_that_raises_answers_is_error_and_the_program_sees_its_message(client: Sandcall) -> None:
    def get_rate(base: str) -> float:
        if base == "XYZ":
            raise ValueError(f"no rate for {base}")
        return 0.92

    class Opaque:
        pass

    def broken() -> object:
        return Opaque()

    code = "\n".join(
        [
            "print(get_rate(base='USD'))",
            "try:",
            "    get_rate(base='XYZ')",
            "except ToolError as e:",
            "    print('caught:', e)",
            "try:",
            "    broken()",
            "except ToolError as e:",
            "    print('broken:', 'not JSON' in str(e))",
        ]
    )
    result = client.run(code, tools={"get_rate": get_rate, "broken": broken})
    assert result.stdout == "0.92\ncaught: no rate for XYZ\nbroken: True\n", result
    failed = result.tool_calls[1]
    assert (failed.name, failed.is_error, failed.error_message, failed.result) == (
        "get_rate",
        True,
        "no rate for XYZ",
        None,
    )
    assert result.tool_calls[2].is_error


def test_an_uncaught_tool_error_ends_the_program_with_its_traceback(client: Sandcall) -> None:
    def fail() -> None:
        raise RuntimeError("the database is down")

    result = client.run("fail()", tools=[fail])
    assert result.status == "completed"
    assert result.exit_code == 1
    assert not result.ok
    assert "the database is down" in result.stderr


def test_results_that_are_dataclasses_reach_the_program_as_json(client: Sandcall) -> None:
    @dataclass
    class Account:
        name: str
        amounts: List[int]

    @tool
    def account(name: str) -> Account:
        """One account."""
        return Account(name, [1, 2])

    assert isinstance(account, Tool)
    assert account("x") == Account("x", [1, 2])  # still callable
    result = client.run("a = account(name='x')\nprint(a['name'], sum(a['amounts']))", tools=[account])
    assert result.stdout == "x 3\n", result


def test_bash_programs_call_the_same_tools(client: Sandcall) -> None:
    def greet(name: str, times: int = 1) -> str:
        return " ".join(["hello " + name] * times)

    result = client.run("greet name=world times=2\ngreet name=x || true", tools={"greet": greet}, language="bash")
    assert result.stdout == "hello world hello world\nhello x\n", result
    assert [c.arguments for c in result.tool_calls] == [{"name": "world", "times": 2}, {"name": "x"}]


def test_a_run_over_its_timeout_ends_as_an_error(client: Sandcall) -> None:
    result = client.run("print('start', flush=True)\nwhile True:\n    pass", timeout=1)
    assert result.status == "error", result
    assert result.error_type == "timeout"
    assert "start" in result.stdout


def test_a_loop_that_cannot_go_on_cancels_its_session(server) -> None:
    seen = {}

    def remember(response: httpx.Response) -> None:
        if response.request.url.path.endswith("/programmatic") and response.status_code == 200:
            response.read()
            seen.setdefault("session_id", response.json().get("session_id"))

    class Stop(BaseException):
        pass

    def stop() -> None:
        raise Stop()

    http = httpx.Client(event_hooks={"response": [remember]})
    with Sandcall(server.base_url, api_key=server.api_key, http_client=http) as sc:
        try:
            sc.run("stop()\nprint('never')", tools=[stop])
        except Stop:
            pass
        else:
            raise AssertionError("run did not raise the tool's BaseException")
        state = sc.session(seen["session_id"])
    http.close()
    assert state["status"] == "error", state
    assert state["error_type"] == "cancelled"


def test_exec_runs_a_program_to_its_end(client: Sandcall) -> None:
    result = client.exec(
        "import sys\nname = sys.stdin.read().strip()\nprint('hello', name, sys.argv[1:])\nsys.exit(3)",
        stdin="world\n",
        args=["a", "b"],
        timeout=20,
    )
    assert result.status == "failed"
    assert result.exit_code == 3
    assert result.stdout == "hello world ['a', 'b']\n"
    assert not result.ok
    assert result.cpu_time is not None and result.memory_peak is not None
    ok = client.exec("echo $((6 * 7))", language="bash")
    assert (ok.status, ok.stdout, ok.ok) == ("ok", "42\n", True)


def test_javascript_programs_gather_calls_with_promise_all(client: Sandcall) -> None:
    both_ran = threading.Barrier(2, timeout=10)

    def get_rate(base: str, quote: str = "EUR") -> float:
        both_ran.wait()  # only passes when the two calls run at the same time
        return {"USD": 0.92, "GBP": 1.17}[base]

    code = "\n".join(
        [
            "const [usd, gbp] = await Promise.all([get_rate({base: 'USD'}), get_rate({base: 'GBP'})]);",
            "console.log(usd, gbp);",
            "try { await get_rate({base: 'XYZ', quote: 1}); } catch (e) { console.log(e instanceof ToolError); }",
        ]
    )
    result = client.run(code, tools=[get_rate], language="javascript")
    assert result.stdout == "0.92 1.17\ntrue\n", result
    assert result.pauses == 1 and len(result.tool_calls) == 2


def test_a_tool_slower_than_the_pause_gets_the_program_a_timeout_and_the_loop_goes_on(short_pause_server) -> None:
    import time

    def slow() -> str:
        time.sleep(2)  # the server's pause ends after 1 s
        return "too late"

    def fast() -> str:
        return "in time"

    # After the timeout (at 1 s) the program runs on for 1.5 s, so the late resume (at
    # 2 s) finds it running and is refused; the SDK then waits for the next pause (at
    # 2.5 s, ending at 3.5 s) and answers it.
    code = "\n".join(
        [
            "import time",
            "try:",
            "    print(slow())",
            "except TimeoutError:",
            "    print('slow timed out')",
            "time.sleep(1.5)",
            "print(fast())",
        ]
    )
    server = short_pause_server
    with Sandcall(server.base_url, api_key=server.api_key) as sc:
        result = sc.run(code, tools=[slow, fast])
    assert result.status == "completed", result
    assert result.stdout == "slow timed out\nin time\n", result
    assert [(c.name, c.result, c.delivered) for c in result.tool_calls] == [
        ("slow", "too late", False),
        ("fast", "in time", True),
    ]
