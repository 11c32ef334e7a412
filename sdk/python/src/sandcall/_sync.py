"""The synchronous client."""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Type, Union

import httpx

from . import _core
from ._errors import APIError, TransportError
from ._tools import Tool, ToolsArg, normalize_tools
from ._types import ExecResult, File, RunResult, ToolCall, _FileClient, _StoredFile


class Sandcall:
    """A client of a sandcall server.

    ``base_url`` defaults to ``SANDCALL_BASE_URL`` or ``http://127.0.0.1:3112``, and
    ``api_key`` to ``SANDCALL_API_KEY`` (none: the server's local mode). Requests that
    are safe to send again (a resume, a request the server refused with 429 or 503, one
    that never reached it) are retried up to ``max_retries`` times, with backoff.
    ``http_timeout`` bounds how long one answer may take, in seconds; by default a run
    waits as long as its program runs. ``http_client`` replaces the ``httpx.Client``
    the SDK would make.
    """

    def __init__(
        self,
        base_url: Optional[str] = None,
        *,
        api_key: Optional[str] = None,
        max_retries: int = 4,
        retry_backoff: float = 0.25,
        http_timeout: Optional[float] = None,
        http_client: Optional[httpx.Client] = None,
    ) -> None:
        self.base_url = _core.base_url_of(base_url)
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff
        self._long_timeout = httpx.Timeout(http_timeout, connect=10.0)
        self._short_timeout = httpx.Timeout(http_timeout if http_timeout is not None else 60.0, connect=10.0)
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client()
        self._headers = _core.headers_of(api_key)

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> "Sandcall":
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    # --- HTTP --------------------------------------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Optional[Mapping[str, str]] = None,
        files: Any = None,
        data: Any = None,
        long: bool = False,
        resend: bool = False,
    ) -> httpx.Response:
        """One request, sent again while that is safe: after a 429/502/503/504 answer,
        after a connection that never opened, and (``resend``: the request may be
        repeated as it is) after any failure in transit."""
        url = f"{self.base_url}/v1{path}"
        timeout = self._long_timeout if long else self._short_timeout
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    method, url, json=json, params=params, files=files, data=data, headers=self._headers, timeout=timeout
                )
            except httpx.TransportError as e:
                never_sent = isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout))
                if attempt >= self.max_retries or files is not None or not (resend or never_sent):
                    raise TransportError(f"{method} {path}: {e}") from e
                time.sleep(_core.retry_delay(attempt, self.retry_backoff))
                attempt += 1
                continue
            if response.status_code in _core.RETRY_STATUSES and attempt < self.max_retries and files is None:
                retry_after = _core.retry_after_of(response.headers)
                response.close()
                time.sleep(_core.retry_delay(attempt, self.retry_backoff, retry_after))
                attempt += 1
                continue
            if response.status_code >= 400:
                raise _core.api_error(response.status_code, response.headers, response.text)
            return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Dict[str, Any]:
        response = self._send(method, path, **kwargs)
        return _core.json_object(response.text, response.status_code)

    # --- Runs --------------------------------------------------------------------------

    def exec(
        self,
        code: str,
        *,
        language: str = "python",
        files: _core.FilesArg = None,
        timeout: Optional[float] = None,
        args: Optional[Sequence[str]] = None,
        stdin: Optional[str] = None,
        limits: Optional[Mapping[str, int]] = None,
    ) -> ExecResult[File]:
        """Runs a program to its end (``POST /v1/exec``). ``timeout`` is in seconds."""
        body = _core.exec_body(
            code,
            language=language,
            files=self._input_files(files),
            timeout=timeout,
            args=args,
            stdin=stdin,
            limits=limits,
        )
        raw = self._json("POST", "/exec", json=body, long=True)
        return _core.exec_result(raw, File, self)

    def run(
        self,
        code: str,
        tools: ToolsArg = None,
        *,
        language: str = "python",
        files: _core.FilesArg = None,
        timeout: Optional[float] = None,
        loop_timeout: Optional[float] = None,
        args: Optional[Sequence[str]] = None,
        max_tool_calls: Optional[int] = None,
        limits: Optional[Mapping[str, int]] = None,
    ) -> RunResult[File]:
        """Runs a program that may call ``tools``, answering its calls until it ends.

        ``tools`` maps each name to a callable (declared from its signature and
        docstring), a :class:`Tool`, or ``(definition, callable)`` with an OpenAI or
        Anthropic definition; a list of those works too. The calls of one pause run at
        the same time, each in its own thread (an ``async`` callable in an event loop of
        its thread). A tool that raises answers the program with an error carrying the
        exception's message. ``timeout`` (seconds) bounds the program's own running
        time, ``loop_timeout`` the whole loop, waits for the tools included.
        """
        declared = normalize_tools(tools)
        body = _core.start_body(
            code,
            language=language,
            tools=[t.declaration() for t in declared.values()],
            files=self._input_files(files),
            timeout=timeout,
            loop_timeout=loop_timeout,
            args=args,
            max_tool_calls=max_tool_calls,
            limits=limits,
        )
        raw = self._json("POST", "/exec/programmatic", json=body, long=True)
        known: Dict[str, ToolCall] = {}
        order: List[ToolCall] = []
        pauses = 0
        try:
            while raw.get("status") == "tool_call_required":
                pauses += 1
                every, fresh = _core.new_calls(raw, pauses, known)
                order.extend(fresh)
                self._answer(fresh, declared)
                try:
                    raw = self._json(
                        "POST", "/exec/programmatic", json=_core.resume_body(raw, every), long=True, resend=True
                    )
                except APIError as e:
                    if not _core.pause_timed_out(e):
                        raise
                    # The program saw a timeout for these calls and went on: carry on
                    # from where it stands now.
                    _core.undelivered(every)
                    raw = self._settled(str(raw.get("session_id")))
        except BaseException:
            self._abandon(raw.get("session_id"))
            raise
        if raw.get("status") not in ("completed", "error"):
            raise APIError(200, f"unexpected session status {raw.get('status')!r}", "invalid_response", raw)
        return _core.run_result(raw, order, pauses, File, self)

    def _settled(self, session_id: str) -> Dict[str, Any]:
        """The session's state once it is no longer running: paused again, or ended."""
        attempt = 0
        while True:
            state = self.session(session_id)
            if state.get("status") != "running":
                return state
            time.sleep(_core.poll_delay(attempt))
            attempt += 1

    def _answer(self, calls: List[ToolCall], tools: Mapping[str, Tool]) -> None:
        if not calls:
            return
        # Every call of the pause at once (the program may have gathered calls that wait
        # on one another), each in a thread of its own, also when it is alone: an async
        # tool then gets an event loop even if the caller's thread runs one.
        with ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="sandcall-tool") as pool:
            for future in [pool.submit(_run_call, c, tools) for c in calls]:
                future.result()

    def _abandon(self, session_id: Any) -> None:
        """Best effort: a loop that cannot go on cancels its session rather than leave the
        program paused until its timers end it."""
        if not isinstance(session_id, str) or not session_id:
            return
        try:
            self._http.post(
                f"{self.base_url}/v1/exec/programmatic/cancel",
                json={"session_id": session_id},
                headers=self._headers,
                timeout=5.0,
            )
        except Exception:
            pass

    def session(self, session_id: str) -> Dict[str, Any]:
        """Where a programmatic session stands (``GET /v1/exec/programmatic/{id}``)."""
        return self._json("GET", f"/exec/programmatic/{_core._segment(session_id)}", resend=True)

    def cancel(self, session_id: str) -> Dict[str, Any]:
        """Kills a programmatic session; answers its end."""
        return self._json("POST", "/exec/programmatic/cancel", json={"session_id": session_id}, resend=True)

    # --- Files -------------------------------------------------------------------------

    def upload(
        self,
        files: Any,
        *,
        kind: Optional[str] = None,
        entity_id: Optional[str] = None,
        read_only: bool = False,
    ) -> List[File]:
        """Stores files (``POST /v1/upload``): a path, a list of paths and
        ``(name, content)`` pairs, or a mapping of name to bytes, text or a Path. All are
        stored under one new ``storage_session_id``, or none is."""
        parts, opened = _core.upload_parts(_core.upload_items(files))
        data: Dict[str, str] = {}
        if kind is not None:
            data["kind"] = kind
        if entity_id is not None:
            data["id"] = entity_id
        if read_only:
            data["read_only"] = "true"
        try:
            raw = self._json("POST", "/upload", files=parts, data=data or None)
        finally:
            for handle in opened:
                handle.close()
        return _core.files_of(File, raw.get("files"), self)

    def download(self, file: Union[_StoredFile, str], file_id: Optional[str] = None) -> bytes:
        """A stored file's bytes: ``download(file)`` or ``download(session_id, file_id)``."""
        return self._send("GET", f"/download/{_core.file_path(file, file_id)}", resend=True).content

    def download_to(
        self, file: Union[_StoredFile, str], path: Union[str, "os.PathLike[str]"], file_id: Optional[str] = None
    ) -> Path:
        """Streams a stored file to ``path``."""
        target = Path(path)
        url = f"{self.base_url}/v1/download/{_core.file_path(file, file_id)}"
        try:
            with self._http.stream("GET", url, headers=self._headers, timeout=self._short_timeout) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _core.api_error(response.status_code, response.headers, response.text)
                with open(target, "wb") as out:
                    for chunk in response.iter_bytes():
                        out.write(chunk)
        except httpx.TransportError as e:
            raise TransportError(f"GET {url}: {e}") from e
        return target

    def files(self, session_id: str) -> List[File]:
        """The caller's files of a session (``GET /v1/files/{id}?detail=normalized``)."""
        response = self._send("GET", f"/files/{_core._segment(session_id)}", params={"detail": "normalized"}, resend=True)
        value = response.json()
        return _core.files_of(File, value, self)

    def delete_file(self, file: Union[_StoredFile, str], file_id: Optional[str] = None) -> None:
        """Deletes a stored file: ``delete_file(file)`` or ``delete_file(session_id, file_id)``."""
        self._send("DELETE", f"/files/{_core.file_path(file, file_id)}", resend=True)

    def health(self) -> Dict[str, Any]:
        """``GET /v1/health``."""
        return self._json("GET", "/health", resend=True)

    def _input_files(self, files: _core.FilesArg) -> List[Dict[str, Any]]:
        plan = _core.plan_files(files)
        pending = [p for p in plan if isinstance(p, _core.PendingUpload)]
        if pending:
            stored = iter(self.upload([(p.name, p.content) for p in pending]))
            return [next(stored).ref(p.name) if isinstance(p, _core.PendingUpload) else p for p in plan]
        return [p for p in plan if isinstance(p, dict)]


if TYPE_CHECKING:
    # mypy checks that Sandcall is the client a File needs (_types._FileClient, a Protocol,
    # since _types may not import this module).
    _client_check: Type[_FileClient] = Sandcall


def _run_call(call: ToolCall, tools: Mapping[str, Tool]) -> None:
    fn = tools[call.name].fn if call.name in tools else _core.unknown_tool(call.name, tools)
    started = time.monotonic()
    outcome: Tuple[bool, Any]
    try:
        value = fn(**call.arguments)
        if inspect.isawaitable(value):
            value = asyncio.run(_awaited(value))
        outcome = (True, value)
    except Exception as e:
        outcome = (False, e)
    call.duration = time.monotonic() - started
    _core.settle(call, outcome)


async def _awaited(value: Any) -> Any:
    return await value
