"""What the sync and async clients share: request bodies, answers, retries, tool results.
No I/O here."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import os
import random
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Type, TypeVar, Union

from ._errors import APIError
from ._types import ExecResult, RunResult, ToolCall, _StoredFile

__version__ = "0.1.0"

DEFAULT_BASE_URL = "http://127.0.0.1:3112"
USER_AGENT = f"sandcall-python/{__version__}"

#: Statuses after which the same request may be sent again: the server refused it before
#: doing anything (429 and 503 come with Retry-After), or a proxy in between failed.
RETRY_STATUSES = frozenset({429, 502, 503, 504})
#: The longest wait between two tries, seconds, whatever Retry-After says.
MAX_RETRY_DELAY = 30.0

F = TypeVar("F", bound=_StoredFile)

# Input files as ``run`` and ``exec`` take them.
LocalContent = Union[bytes, str, "os.PathLike[str]"]
FileInput = Union[_StoredFile, Mapping[str, Any], str, "os.PathLike[str]", Tuple[str, Any]]
FilesArg = Union[Sequence[FileInput], Mapping[str, Any], None]


def base_url_of(base_url: Optional[str]) -> str:
    """The server's root URL, from the argument or SANDCALL_BASE_URL, without a trailing
    ``/`` or ``/v1``."""
    url = base_url or os.environ.get("SANDCALL_BASE_URL") or DEFAULT_BASE_URL
    url = url.rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


def headers_of(api_key: Optional[str]) -> Dict[str, str]:
    key = api_key if api_key is not None else os.environ.get("SANDCALL_API_KEY")
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return headers


def ms(seconds: Optional[float], what: str) -> Optional[int]:
    """Seconds (the SDK's unit) to the API's milliseconds."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        raise ValueError(f"{what} must be a positive number of seconds, not {seconds!r}")
    return max(1, int(round(seconds * 1000)))


def exec_body(
    code: str,
    *,
    language: str,
    files: List[Dict[str, Any]],
    timeout: Optional[float],
    args: Optional[Sequence[str]],
    stdin: Optional[str],
    limits: Optional[Mapping[str, int]],
) -> Dict[str, Any]:
    body: Dict[str, Any] = {"language": language, "code": code}
    if files:
        body["files"] = files
    if args is not None:
        body["args"] = list(args)
    if stdin is not None:
        body["stdin"] = stdin
    if limits is not None:
        body["limits"] = dict(limits)
    timeout_ms = ms(timeout, "timeout")
    if timeout_ms is not None:
        body["timeout"] = timeout_ms
    return body


def start_body(
    code: str,
    *,
    language: str,
    tools: List[Dict[str, Any]],
    files: List[Dict[str, Any]],
    timeout: Optional[float],
    loop_timeout: Optional[float],
    args: Optional[Sequence[str]],
    max_tool_calls: Optional[int],
    limits: Optional[Mapping[str, int]],
) -> Dict[str, Any]:
    body: Dict[str, Any] = {"language": language, "code": code, "tools": tools}
    if files:
        body["files"] = files
    if args is not None:
        body["args"] = list(args)
    if limits is not None:
        body["limits"] = dict(limits)
    if max_tool_calls is not None:
        body["max_tool_calls"] = max_tool_calls
    timeout_ms = ms(timeout, "timeout")
    if timeout_ms is not None:
        body["timeout"] = timeout_ms
    loop_ms = ms(loop_timeout, "loop_timeout")
    if loop_ms is not None:
        body["loop_timeout"] = loop_ms
    return body


def retry_after_of(headers: Mapping[str, str]) -> Optional[float]:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def retry_delay(attempt: int, backoff: float, retry_after: Optional[float] = None) -> float:
    """Seconds to wait before try ``attempt + 1``: the server's Retry-After when it sent
    one, else exponential backoff with jitter; never more than MAX_RETRY_DELAY."""
    if retry_after is not None:
        return min(retry_after, MAX_RETRY_DELAY)
    return min(float(backoff * (2**attempt) * random.uniform(0.5, 1.0)), MAX_RETRY_DELAY)


def api_error(status: int, headers: Mapping[str, str], text: str) -> APIError:
    """The APIError of a refused request, from its ``{"error", "error_type"}`` body (or
    whatever a proxy in between answered)."""
    body: Dict[str, Any] = {}
    try:
        parsed = json.loads(text)
        if isinstance(parsed, dict):
            body = parsed
    except ValueError:
        pass
    error = body.get("error")
    error_type = body.get("error_type")
    return APIError(
        status,
        error if isinstance(error, str) else (text.strip()[:500] or f"HTTP {status}"),
        error_type if isinstance(error_type, str) else "http_error",
        body,
        retry_after_of(headers),
    )


def json_object(text: str, status: int) -> Dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        raise APIError(status, f"the server answered something that is not JSON: {text[:200]!r}", "invalid_response")
    if not isinstance(value, dict):
        raise APIError(status, "the server answered JSON that is not an object", "invalid_response")
    return value


def file_of(cls: Type[F], raw: Mapping[str, Any], client: Any) -> F:
    size = raw.get("size")
    made = cls(
        id=str(raw.get("id") or raw.get("fileId") or ""),
        name=str(raw.get("name") or raw.get("filename") or ""),
        storage_session_id=str(raw.get("storage_session_id") or raw.get("session_id") or ""),
        size=size if isinstance(size, int) else None,
        content_type=raw.get("content_type") or raw.get("contentType"),
        inherited=bool(raw.get("inherited", False)),
        modified_from=raw.get("modified_from"),
        last_modified=raw.get("lastModified"),
        read_only=bool(raw.get("read_only", False)),
        raw=dict(raw),
    )
    made._client = client  # type: ignore[attr-defined]
    return made


def files_of(cls: Type[F], raw: Any, client: Any) -> List[F]:
    if not isinstance(raw, list):
        return []
    return [file_of(cls, f, client) for f in raw if isinstance(f, Mapping)]


def exec_result(raw: Dict[str, Any], cls: Type[F], client: Any) -> ExecResult[Any]:
    return ExecResult(
        session_id=raw.get("session_id", ""),
        status=raw.get("status", ""),
        stdout=raw.get("stdout", ""),
        stderr=raw.get("stderr", ""),
        exit_code=raw.get("exit_code"),
        signal=raw.get("signal"),
        files=files_of(cls, raw.get("files"), client),
        timed_out=bool(raw.get("timed_out", False)),
        oom_killed=bool(raw.get("oom_killed", False)),
        stdout_truncated=bool(raw.get("stdout_truncated", False)),
        stderr_truncated=bool(raw.get("stderr_truncated", False)),
        files_skipped=list(raw.get("files_skipped") or []),
        execution_time=raw.get("execution_time"),
        cpu_time=raw.get("cpu_time"),
        memory_peak=raw.get("memory_peak"),
        raw=raw,
    )


def run_result(raw: Dict[str, Any], calls: List[ToolCall], pauses: int, cls: Type[F], client: Any) -> RunResult[Any]:
    return RunResult(
        session_id=raw.get("session_id", ""),
        status=raw.get("status", ""),
        stdout=raw.get("stdout", ""),
        stderr=raw.get("stderr", ""),
        exit_code=raw.get("exit_code"),
        signal=raw.get("signal"),
        files=files_of(cls, raw.get("files"), client),
        tool_calls=calls,
        pauses=pauses,
        error_type=raw.get("error_type"),
        error=raw.get("error"),
        execution_time=raw.get("execution_time"),
        stdout_truncated=bool(raw.get("stdout_truncated", False)),
        stderr_truncated=bool(raw.get("stderr_truncated", False)),
        files_skipped=list(raw.get("files_skipped") or []),
        raw=raw,
    )


# --- Input files ---------------------------------------------------------------------


class PendingUpload:
    """A local file that ``run`` or ``exec`` uploads before the request names it."""

    def __init__(self, name: str, content: Any) -> None:
        self.name = name
        self.content = content


def plan_files(files: FilesArg) -> List[Union[Dict[str, Any], PendingUpload]]:
    """Reads the ``files`` argument: stored files (``File``, or the API's
    ``{"id", "storage_session_id", "name"}``) are named as they are, and local ones (a
    path, ``(name, bytes)``, or in a mapping of name to bytes, text, a ``Path`` or a
    ``File``) are uploaded first."""
    if files is None:
        return []
    plan: List[Union[Dict[str, Any], PendingUpload]] = []
    if isinstance(files, Mapping):
        for name, value in files.items():
            if not isinstance(name, str):
                raise TypeError(f"file names must be strings, not {name!r}")
            if isinstance(value, _StoredFile):
                plan.append(value.ref(name))
            elif isinstance(value, (bytes, bytearray, str)) or isinstance(value, os.PathLike):
                plan.append(PendingUpload(name, value))
            else:
                raise TypeError(f"file {name!r}: give bytes, text, a Path or a File, not {type(value).__name__}")
        return plan
    if isinstance(files, (str, bytes)) or not isinstance(files, Sequence):
        raise TypeError("files must be a list (or a dict of name -> content)")
    for item in files:
        if isinstance(item, _StoredFile):
            plan.append(item.ref())
        elif isinstance(item, Mapping):
            plan.append(dict(item))
        elif isinstance(item, (str, os.PathLike)):
            path = Path(item)
            plan.append(PendingUpload(path.name, path))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            plan.append(PendingUpload(item[0], item[1]))
        else:
            raise TypeError(f"cannot use {item!r} as an input file")
    return plan


def upload_parts(uploads: Sequence[Tuple[str, Any]]) -> Tuple[List[Tuple[str, Tuple[str, Any]]], List[Any]]:
    """The multipart ``file`` parts of ``(name, content)`` pairs, and the files opened for
    them (to close once sent). Text is sent as UTF-8; a path is streamed from disk."""
    parts: List[Tuple[str, Tuple[str, Any]]] = []
    opened: List[Any] = []
    try:
        for name, content in uploads:
            if isinstance(content, str):
                content = content.encode()
            elif isinstance(content, bytearray):
                content = bytes(content)
            elif isinstance(content, os.PathLike):
                handle = open(content, "rb")
                opened.append(handle)
                content = handle
            elif not isinstance(content, bytes) and not hasattr(content, "read"):
                raise TypeError(f"file {name!r}: give bytes, text, a path or a binary file, not {type(content).__name__}")
            parts.append(("file", (name, content)))
    except BaseException:
        for handle in opened:
            handle.close()
        raise
    return parts, opened


def upload_items(files: Any) -> List[Tuple[str, Any]]:
    """The ``(name, content)`` pairs of ``upload``'s argument: a path, a list of paths and
    ``(name, content)`` pairs, or a mapping of name to content."""
    if isinstance(files, (str, os.PathLike)):
        return [(Path(files).name, Path(files))]
    if isinstance(files, Mapping):
        out = []
        for name, content in files.items():
            out.append((name, Path(content) if isinstance(content, os.PathLike) else content))
        return out
    if isinstance(files, tuple) and len(files) == 2 and isinstance(files[0], str) and not isinstance(files[1], str):
        return [files]
    items = []
    for item in files:
        if isinstance(item, (str, os.PathLike)):
            items.append((Path(item).name, Path(item)))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            items.append(item)
        else:
            raise TypeError(f"cannot upload {item!r}: give a path or (name, content)")
    if not items:
        raise ValueError("nothing to upload")
    return items


def file_path(file: Union[_StoredFile, str], file_id: Optional[str]) -> str:
    """``/v1/download/{session}/{file}`` and friends: from a File, or the two ids."""
    if isinstance(file, _StoredFile):
        if file_id is not None:
            raise TypeError("give a File, or a session id and a file id, not both")
        return f"{_segment(file.storage_session_id)}/{_segment(file.id)}"
    if file_id is None:
        raise TypeError("give a File, or a session id and a file id")
    return f"{_segment(file)}/{_segment(file_id)}"


def _segment(value: str) -> str:
    from urllib.parse import quote

    return quote(str(value), safe="")


# --- Tool results --------------------------------------------------------------------


def to_json(value: Any) -> Any:
    """The JSON value of a tool's return value: JSON types as they are, and dataclasses,
    pydantic models, enums, sets, tuples, paths and dates converted. Raises TypeError for
    anything else."""
    return json.loads(json.dumps(value, default=_json_default, allow_nan=False))


def _json_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    dump = getattr(value, "model_dump", None)
    if callable(dump):  # pydantic v2
        return dump(mode="json")
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return list(value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def error_message_of(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def settle(call: ToolCall, outcome: Tuple[bool, Any]) -> ToolCall:
    """Records what a tool did (``(True, value)`` or ``(False, exception)``), as the
    program will see it."""
    succeeded, value = outcome
    if succeeded:
        try:
            call.result = to_json(value)
            call.is_error = False
        except (TypeError, ValueError) as e:
            call.result = None
            call.is_error = True
            call.error_message = f"tool {call.name!r} returned a value that is not JSON: {e}"
    else:
        call.result = None
        call.is_error = True
        call.error_message = error_message_of(value)
    return call


def tool_result(call: ToolCall) -> Dict[str, Any]:
    result: Dict[str, Any] = {"call_id": call.id, "result": call.result, "is_error": call.is_error}
    if call.is_error:
        result["error_message"] = call.error_message or "the tool failed"
    return result


def new_calls(raw: Dict[str, Any], pause: int, known: Dict[str, ToolCall]) -> Tuple[List[ToolCall], List[ToolCall]]:
    """The calls of a pause: (all of them, the ones not answered before). A call the
    server hands out again (its id already answered: a replayed session) is answered
    from the record, not run twice."""
    every: List[ToolCall] = []
    fresh: List[ToolCall] = []
    for item in raw.get("tool_calls") or []:
        if not isinstance(item, Mapping):
            continue
        call_id = str(item.get("id", ""))
        if call_id in known:
            every.append(known[call_id])
            continue
        arguments = item.get("arguments", item.get("input"))
        call = ToolCall(
            id=call_id,
            name=str(item.get("name", "")),
            arguments=dict(arguments) if isinstance(arguments, Mapping) else {},
            pause=pause,
        )
        known[call_id] = call
        every.append(call)
        fresh.append(call)
    return every, fresh


def resume_body(raw: Dict[str, Any], calls: List[ToolCall]) -> Dict[str, Any]:
    return {
        "session_id": raw.get("session_id"),
        "continuation_token": raw.get("continuation_token"),
        "tool_results": [tool_result(c) for c in calls],
    }


def pause_timed_out(error: APIError) -> bool:
    """A resume refused because its pause had already ended: the server's
    ``tool_call_timeout_ms`` passed while the tools ran, the program got a timeout for
    those calls and went on. (A retry of an accepted resume is never refused so.)"""
    return error.status_code == 409 and error.error_type == "continuation_token_used"


def undelivered(calls: List[ToolCall]) -> None:
    for call in calls:
        call.delivered = False


def poll_delay(attempt: int) -> float:
    """Seconds between two looks at a running session: 50 ms, doubling up to 1 s."""
    return float(min(0.05 * (2**attempt), 1.0))


def unknown_tool(name: str, known: Mapping[str, Any]) -> Callable[..., Any]:
    def missing(**_: Any) -> Any:
        raise LookupError(f"no tool named {name!r} was given to run (tools: {', '.join(sorted(known)) or 'none'})")

    return missing
