"""Exceptions. Every error the API answers becomes the subclass of
:class:`APIError` named by its ``code`` (``not_found`` → :class:`NotFound`),
carrying the server's message, the HTTP status and ``Retry-After``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .models import BuildEvent, ExecResult

__all__ = [
    "WarrenError",
    "TransportError",
    "APIError",
    "BadRequest",
    "InvalidSpec",
    "Unauthorized",
    "NotFound",
    "Conflict",
    "PayloadTooLarge",
    "TooManyRequests",
    "QueueFull",
    "NoCapacity",
    "Unavailable",
    "BadGateway",
    "InternalError",
    "ExecError",
    "ExecTimeout",
    "CommandFailed",
    "StreamError",
    "BuildFailed",
    "ERROR_CLASSES",
]


class WarrenError(Exception):
    """Base of every exception the SDK raises."""


class TransportError(WarrenError):
    """The daemon could not be reached, or the connection broke."""


class APIError(WarrenError):
    """The daemon answered with an error body ``{"error": {"code", "message"}}``."""

    code: str = "unknown"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int = 0,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.status = status
        self.retry_after = retry_after
        """Seconds the server asked us to wait before trying again, if any."""

    def __str__(self) -> str:
        return f"{self.message} ({self.code}, HTTP {self.status})"


class BadRequest(APIError):
    """400: the request is invalid (a bad spec, size, selector, path...)."""

    code = "bad_request"


InvalidSpec = BadRequest
"""Alias: a sandbox spec the server refused is a :class:`BadRequest`."""


class Unauthorized(APIError):
    """401: missing or wrong token."""

    code = "unauthorized"


class Forbidden(APIError):
    """403: the caller may not do this (a route for the API token only)."""

    code = "forbidden"


class NotFound(APIError):
    """404: no such sandbox, batch, image or profile."""

    code = "not_found"


class Conflict(APIError):
    """409: not in this state (exec into a destroyed or paused sandbox, an
    image in use, a sandbox destroyed while a file streamed...)."""

    code = "conflict"


class PayloadTooLarge(APIError):
    """413: a body read whole is over 32 MiB; send files through ``files``."""

    code = "payload_too_large"


class TooManyRequests(APIError):
    """429: the node's create queue is full; ``retry_after`` says when to retry."""

    code = "too_many_requests"


QueueFull = TooManyRequests


class NoCapacity(APIError):
    """503: the node cannot start sandboxes now (its disk is below the floor)."""

    code = "no_capacity"


class Unavailable(APIError):
    """503: not now (the daemon is recovering or stopping, or a sandbox's
    init did not answer in time); retry after ``retry_after``."""

    code = "unavailable"


class BadGateway(APIError):
    """502: an image registry failed, could not be reached or served content
    that does not match its digest."""

    code = "bad_gateway"


class InternalError(APIError):
    """500: a bug or an unexpected failure in the daemon."""

    code = "internal"


ERROR_CLASSES: dict[str, type[APIError]] = {
    c.code: c
    for c in (
        BadRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        Conflict,
        PayloadTooLarge,
        TooManyRequests,
        NoCapacity,
        Unavailable,
        BadGateway,
        InternalError,
    )
}
"""The API's error codes (``ErrorCode`` in ``/openapi.json``) and their classes."""

_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    429: TooManyRequests,
    500: InternalError,
    502: BadGateway,
    503: Unavailable,
}


def error_for(status: int, code: str | None, message: str, retry_after: float | None) -> APIError:
    cls = ERROR_CLASSES.get(code or "") or _BY_STATUS.get(status, APIError)
    return cls(message, code=code or cls.code, status=status, retry_after=retry_after)


class ExecError(WarrenError):
    """Base of the errors about a command's outcome (they carry ``result``)."""

    def __init__(self, message: str, result: ExecResult) -> None:
        super().__init__(message)
        self.result = result

    @property
    def stdout(self) -> bytes:
        return self.result.stdout

    @property
    def stderr(self) -> bytes:
        return self.result.stderr


class ExecTimeout(ExecError):
    """The exec's ``timeout`` ran out and its process tree was killed; the
    output it produced until then is in ``result`` (pass ``raise_on_timeout=False``
    to get the result back instead)."""

    def __init__(self, result: ExecResult) -> None:
        super().__init__(
            f"command timed out after {result.duration:.3f}s and was killed (exit {result.exit_code})",
            result,
        )


class CommandFailed(ExecError):
    """A command run with ``check=True`` exited non-zero."""

    def __init__(self, result: ExecResult) -> None:
        tail = result.stderr_text[-500:]
        super().__init__(f"command exited {result.exit_code}: {tail}", result)
        self.exit_code = result.exit_code


class StreamError(WarrenError):
    """A stream ended badly: an exec stream without an exit event (the
    sandbox was destroyed meanwhile) or with an ``error`` event."""


class BuildFailed(WarrenError):
    """An image build failed: a step's command, the Dockerfile (``line``
    names the line at fault), or the ``test``. ``events`` holds every build
    event, the steps' output among them."""

    def __init__(self, message: str, line: int | None, build_id: str | None, events: list[BuildEvent]) -> None:
        super().__init__(f"Dockerfile line {line}: {message}" if line and "line" not in message else message)
        self.line = line
        self.build_id = build_id
        self.events = events
