"""A small MCP server (FastMCP, stdio) whose tools programs call through sandcall.
Each call is appended to the file named by WEATHER_CALLS, so the test can see that the
server, not the caller, answered it."""

import json
import os

from mcp.server.fastmcp import FastMCP

server = FastMCP("weather")


def record(name: str, arguments: dict) -> None:
    with open(os.environ["WEATHER_CALLS"], "a") as f:
        f.write(json.dumps({"tool": name, "arguments": arguments}) + "\n")


@server.tool()
def forecast(city: str, days: int = 1) -> dict:
    """The forecast of a city: a temperature for each day."""
    record("forecast", {"city": city, "days": days})
    return {"city": city, "temperatures": [20 + i for i in range(days)]}


@server.tool()
def broken(why: str) -> str:
    """Always fails, with the reason given."""
    record("broken", {"why": why})
    raise ValueError(f"broken on purpose: {why}")


if __name__ == "__main__":
    server.run("stdio")
