"""The results the clients return: plain dataclasses, built from the API's JSON."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Generic, List, Optional, Protocol, TypeVar, Union


@dataclass
class _StoredFile:
    """A file stored by the server: an upload, or a run's output."""

    id: str
    name: str
    storage_session_id: str
    size: Optional[int] = None
    content_type: Optional[str] = None
    #: True for an input the run returned as it was (its own id and storage session).
    inherited: bool = False
    #: For an input the run changed: ``{"id", "storage_session_id"}`` of that input.
    modified_from: Optional[Dict[str, str]] = None
    #: When it was stored (RFC 3339), in listings.
    last_modified: Optional[str] = None
    #: True for a file uploaded with ``read_only``, in listings.
    read_only: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def ref(self, name: Optional[str] = None) -> Dict[str, str]:
        """The entry that names this file as a run's input, under ``name`` (default: its
        own name)."""
        return {"id": self.id, "storage_session_id": self.storage_session_id, "name": name or self.name}

    def _target(self, path: Union[str, "os.PathLike[str]", None]) -> Path:
        base = os.path.basename(self.name) or self.id
        if path is None:
            return Path(base)
        target = Path(path)
        return target / base if target.is_dir() else target


class _FileClient(Protocol):
    """What a :class:`File` needs of its client (:class:`Sandcall` is one): described here
    rather than imported, since the clients import this module."""

    def download(self, file: _StoredFile) -> bytes: ...

    def download_to(self, file: _StoredFile, path: Path) -> Path: ...


class _AsyncFileClient(Protocol):
    """What an :class:`AsyncFile` needs of its client (:class:`AsyncSandcall` is one)."""

    async def download(self, file: _StoredFile) -> bytes: ...

    async def download_to(self, file: _StoredFile, path: Path) -> Path: ...


@dataclass
class File(_StoredFile):
    """A stored file, from :class:`Sandcall`: ``download()`` gives its bytes."""

    _client: Optional[_FileClient] = field(default=None, repr=False, compare=False)

    def download(self) -> bytes:
        """The file's bytes."""
        if self._client is None:
            raise RuntimeError("this File is not bound to a client")
        return self._client.download(self)

    def save(self, path: Union[str, "os.PathLike[str]", None] = None) -> Path:
        """Writes the file to ``path`` (a file, or a folder to put it in under its base
        name; default: the current folder) and returns where it went."""
        if self._client is None:
            raise RuntimeError("this File is not bound to a client")
        return self._client.download_to(self, self._target(path))


@dataclass
class AsyncFile(_StoredFile):
    """A stored file, from :class:`AsyncSandcall`: ``await download()`` gives its bytes."""

    _client: Optional[_AsyncFileClient] = field(default=None, repr=False, compare=False)

    async def download(self) -> bytes:
        """The file's bytes."""
        if self._client is None:
            raise RuntimeError("this AsyncFile is not bound to a client")
        return await self._client.download(self)

    async def save(self, path: Union[str, "os.PathLike[str]", None] = None) -> Path:
        """Writes the file to ``path`` (a file, or a folder to put it in under its base
        name; default: the current folder) and returns where it went."""
        if self._client is None:
            raise RuntimeError("this AsyncFile is not bound to a client")
        return await self._client.download_to(self, self._target(path))


FileT = TypeVar("FileT", File, AsyncFile)


@dataclass
class ToolCall:
    """One call the program made to a tool, and what it was answered."""

    #: The call's id: stable across retries, so a tool with side effects may use it as an
    #: idempotency key.
    id: str
    #: The declared name of the tool.
    name: str
    #: The arguments object, already checked by the server against the tool's schema.
    arguments: Dict[str, Any]
    #: The result sent to the program (None when the tool raised).
    result: Any = None
    #: True when the tool raised: the program got an error (``ToolError`` in Python).
    is_error: bool = False
    #: With ``is_error``: the message the program saw.
    error_message: Optional[str] = None
    #: Which pause (1, 2, ...) of the session handed this call out.
    pause: int = 0
    #: False when the pause ended (the server's ``tool_call_timeout_ms``) before the
    #: result reached the program, which then got a timeout for this call instead.
    delivered: bool = True
    #: How long the tool ran, in seconds.
    duration: float = 0.0


@dataclass
class RunResult(Generic[FileT]):
    """The end of a :meth:`Sandcall.run`: the session's final answer and every tool call."""

    session_id: str
    #: ``completed`` (the program ended by itself, whatever its exit code) or ``error``
    #: (it could not finish: see ``error_type``).
    status: str
    stdout: str
    stderr: str
    exit_code: Optional[int]
    signal: Optional[str]
    files: List[FileT]
    #: Every call the program made, in the order they were handed out.
    tool_calls: List[ToolCall]
    #: How many times the program paused for its tools.
    pauses: int
    #: With status ``error``: ``timeout``, ``cancelled``, ``sandbox_failure``, ...
    error_type: Optional[str] = None
    error: Optional[str] = None
    #: Wall-clock ms from the program's start to its end, pauses included.
    execution_time: Optional[int] = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    files_skipped: List[Dict[str, Any]] = field(default_factory=list)
    #: The final response as the server sent it.
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        """The program completed with exit code 0."""
        return self.status == "completed" and self.exit_code == 0


@dataclass
class ExecResult(Generic[FileT]):
    """The answer of :meth:`Sandcall.exec` (``POST /v1/exec``)."""

    session_id: str
    #: ``ok``, ``failed`` (non-zero exit), ``timed_out`` or ``killed``.
    status: str
    stdout: str
    stderr: str
    exit_code: Optional[int]
    signal: Optional[str]
    files: List[FileT]
    timed_out: bool = False
    oom_killed: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    files_skipped: List[Dict[str, Any]] = field(default_factory=list)
    #: Wall-clock ms of the program.
    execution_time: Optional[int] = None
    #: CPU ms of all the run's processes.
    cpu_time: Optional[int] = None
    #: Peak memory of the run, bytes.
    memory_peak: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        """The program exited with status 0."""
        return self.status == "ok"
