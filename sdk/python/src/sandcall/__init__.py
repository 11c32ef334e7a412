"""sandcall: the Python client of a sandcall server, with the tool-calling loop built in.

    from sandcall import Sandcall

    def get_rate(base: str, quote: str) -> float:
        \"\"\"How much one unit of base is worth in quote.\"\"\"
        return 0.92

    with Sandcall("http://127.0.0.1:3112") as sc:
        result = sc.run('print(get_rate(base="USD", quote="EUR"))', tools={"get_rate": get_rate})
        print(result.stdout)
"""

from ._async import AsyncSandcall
from ._core import __version__
from ._errors import APIError, SandcallError, TransportError
from ._sync import Sandcall
from ._tools import Tool, schema_for_type, schema_from_signature, tool
from ._types import AsyncFile, ExecResult, File, RunResult, ToolCall

__all__ = [
    "APIError",
    "AsyncFile",
    "AsyncSandcall",
    "ExecResult",
    "File",
    "RunResult",
    "Sandcall",
    "SandcallError",
    "Tool",
    "ToolCall",
    "TransportError",
    "__version__",
    "schema_for_type",
    "schema_from_signature",
    "tool",
]
