"""The SDK's exceptions: one for answers the API refused, one for requests that never got
an answer."""

from __future__ import annotations

from typing import Any, Dict, Optional


class SandcallError(Exception):
    """Base class of every error this SDK raises."""


class APIError(SandcallError):
    """The server refused a request: a 4xx or 5xx answer.

    ``error_type`` is the API's stable code (``invalid_request``, ``unauthorized``,
    ``session_not_found``, ...): match on it, not on the message. ``error`` is the
    server's message for people, ``status_code`` the HTTP status, ``body`` the whole
    parsed answer (some errors carry more fields, such as ``code``), and
    ``retry_after`` the ``Retry-After`` header in seconds, when the server sent one.
    """

    def __init__(
        self,
        status_code: int,
        error: str,
        error_type: str,
        body: Optional[Dict[str, Any]] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(f"{status_code} {error_type}: {error}")
        self.status_code = status_code
        self.error = error
        self.error_type = error_type
        self.body: Dict[str, Any] = body if body is not None else {}
        self.retry_after = retry_after

    @property
    def code(self) -> Optional[str]:
        """The error's ``code`` field, where the API sends one (``unsupported_capability``
        for a language the server does not run)."""
        value = self.body.get("code")
        return value if isinstance(value, str) else None


class TransportError(SandcallError):
    """The request got no answer: the connection failed, was dropped or timed out (after
    the retries that were safe to make). The underlying ``httpx`` error is the
    ``__cause__``."""
