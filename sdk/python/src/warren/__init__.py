"""Warren's Python SDK: isolated, disposable sandboxes for agent and RL
training, from synchronous code (:class:`Client`) or asyncio
(:class:`AsyncClient`), with the same calls on both.

>>> import warren
>>> with warren.Client() as client:
...     with client.sandbox(image="busybox:latest", cpu=1, memory="512M") as sb:
...         print(sb.exec(["echo", "hello"]).stdout_text)
"""

from . import models
from ._async import (
    AsyncBatch,
    AsyncClient,
    AsyncEventStream,
    AsyncExecStream,
    AsyncFiles,
    AsyncLogStream,
    AsyncPort,
    AsyncProcess,
    AsyncSandbox,
)
from ._sync import (
    Batch,
    Client,
    EventStream,
    ExecStream,
    Files,
    LogStream,
    Port,
    Process,
    Sandbox,
)
from .errors import (
    APIError,
    BadGateway,
    BadRequest,
    CommandFailed,
    Conflict,
    ExecError,
    ExecTimeout,
    InternalError,
    InvalidSpec,
    NoCapacity,
    NotFound,
    PayloadTooLarge,
    QueueFull,
    StreamError,
    TooManyRequests,
    TransportError,
    Unauthorized,
    Forbidden,
    Unavailable,
    WarrenError,
)
from .models import (
    BatchInfo,
    Event,
    ExecExit,
    ExecOutput,
    ExecResult,
    ExecStart,
    Image,
    LogLine,
    PathEntry,
    SandboxInfo,
    Usage,
)

__version__ = "0.1.0"

__all__ = [
    "models",
    "Client",
    "AsyncClient",
    "Sandbox",
    "AsyncSandbox",
    "Batch",
    "AsyncBatch",
    "ExecStream",
    "AsyncExecStream",
    "Process",
    "AsyncProcess",
    "Files",
    "AsyncFiles",
    "Port",
    "AsyncPort",
    "EventStream",
    "AsyncEventStream",
    "LogStream",
    "AsyncLogStream",
    "WarrenError",
    "TransportError",
    "APIError",
    "BadRequest",
    "InvalidSpec",
    "Unauthorized",
    "Forbidden",
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
    "BatchInfo",
    "Event",
    "ExecExit",
    "ExecOutput",
    "ExecResult",
    "ExecStart",
    "Image",
    "LogLine",
    "PathEntry",
    "SandboxInfo",
    "Usage",
]
