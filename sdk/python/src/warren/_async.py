"""The asyncio client: the same calls as :mod:`warren._sync`, awaited. The
requests and answers are those of :mod:`warren._core`; one event loop
drives as many sandboxes as the daemon holds (no thread per sandbox: the
lease keeper is one task per client)."""

from __future__ import annotations

import asyncio
import builtins
import collections
import contextlib
import os
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar

import httpx

from . import _core as core
from . import errors, models
from ._core import Call, Cmd, Labels, Seconds

T = TypeVar("T")

__all__ = [
    "AsyncClient",
    "AsyncSandbox",
    "AsyncSandboxes",
    "AsyncFiles",
    "AsyncNetwork",
    "AsyncPort",
    "AsyncExecStream",
    "AsyncProcess",
    "AsyncBatch",
    "AsyncBatches",
    "AsyncImages",
    "AsyncSecrets",
    "AsyncTenants",
    "AsyncTokens",
    "AsyncVolumes",
    "AsyncProfiles",
    "AsyncEventStream",
    "AsyncLogStream",
]


async def _aiter(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    # Local files are read in 1 MiB chunks on the loop (page-cache reads).
    for b in chunks:
        yield b


def _abody(content: Any) -> Any:
    if content is None or isinstance(content, (bytes, str)) or hasattr(content, "__aiter__"):
        return content
    return _aiter(content)


class AsyncClient:
    """The asyncio twin of :class:`warren.Client`: the same calls, awaited.

    >>> async with warren.AsyncClient() as client:
    ...     async with client.sandbox(image="busybox:latest") as sb:
    ...         print((await sb.exec("echo hi")).stdout_text)
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        home: str | os.PathLike[str] | None = None,
        timeout: float | httpx.Timeout | None = 60.0,
        max_retries: int = 5,
        limits: httpx.Limits | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        verify: bool | ssl.SSLContext = True,
    ) -> None:
        self._cfg = core.Config.resolve(url, token, home)
        self._http = httpx.AsyncClient(
            base_url=self._cfg.url,
            headers=self._cfg.headers(),
            timeout=core.default_timeout(timeout),
            limits=limits or core.default_limits(),
            transport=transport,
            verify=verify,
        )
        self._retry = core.RetryPolicy(max_retries=max_retries)
        self._leases = core.LeaseSchedule()
        self._lease_wake: asyncio.Event | None = None
        self._keeper: asyncio.Task[None] | None = None
        self.sandboxes = AsyncSandboxes(self)
        self.batches = AsyncBatches(self)
        self.images = AsyncImages(self)
        self.profiles = AsyncProfiles(self)
        self.volumes = AsyncVolumes(self)
        self.secrets = AsyncSecrets(self)
        self.tenants = AsyncTenants(self)
        self.tokens = AsyncTokens(self)

    @property
    def url(self) -> str:
        return self._cfg.url

    # ------------------------------------------------------------ plumbing

    async def _send(self, call: Call[Any]) -> httpx.Response:
        attempt = 0
        if call.content is not None:
            call.content = _abody(call.content)
        while True:
            resp: httpx.Response | None = None
            try:
                resp = await self._http.send(call.request(self._http), stream=True)
                if not (resp.is_success and call.stream):
                    await resp.aread()
                    await resp.aclose()
            except httpx.TransportError as e:
                if resp is not None:
                    await resp.aclose()
                delay = self._retry.after_error(call, attempt, e)
                if delay is None:
                    raise core.transport_error(self._cfg.url, e) from e
            else:
                if resp.is_success:
                    if call.sandbox:
                        self._leases.touched(call.sandbox, time.monotonic())
                    return resp
                delay = self._retry.after_status(call, attempt, resp)
                if delay is None:
                    raise core.api_error(resp)
            attempt += 1
            await asyncio.sleep(delay)

    async def _call(self, call: Call[T]) -> T:
        return call.parse(await self._send(call))

    async def _lines(self, resp: httpx.Response) -> AsyncIterator[str]:
        try:
            async for line in resp.aiter_lines():
                yield line
        except httpx.TransportError as e:
            raise core.transport_error(self._cfg.url, e) from e
        finally:
            await resp.aclose()

    # ------------------------------------------------------------ lease keeper

    def _keep(self, sid: str, lease: float) -> None:
        self._leases.add(sid, lease, time.monotonic())
        if self._keeper is None or self._keeper.done():
            self._lease_wake = asyncio.Event()
            self._keeper = asyncio.get_running_loop().create_task(self._keep_loop(), name="warren-lease-keeper")
        assert self._lease_wake is not None
        self._lease_wake.set()

    def _unkeep(self, sid: str) -> None:
        self._leases.remove(sid)

    async def _keep_loop(self) -> None:
        assert self._lease_wake is not None
        while True:
            now = time.monotonic()
            due = self._leases.due(now)
            if not due:
                self._lease_wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._lease_wake.wait(), self._leases.next_wake(now))
                continue
            for sid in due:
                self._leases.touched(sid, now)
            await asyncio.gather(*(self._beat(sid) for sid in due))

    async def _beat(self, sid: str) -> None:
        try:
            info = await self._call(core.action_call(sid, "heartbeat"))
            if info.is_final:
                self._unkeep(sid)
        except errors.NotFound:
            self._unkeep(sid)
        except errors.WarrenError:
            pass

    # ------------------------------------------------------------ top-level calls

    def sandbox(self, image: str | None = None, *, keep_alive: bool = True, wait: bool = True, **spec: Any) -> _Creating:
        """Creates a sandbox (see :meth:`warren.Client.sandbox`). Await it, or
        use ``async with client.sandbox(...) as sb:`` to destroy it on exit."""
        return _Creating(self.sandboxes.create(image, keep_alive=keep_alive, wait=wait, **spec))

    async def batch(
        self,
        count: int,
        image: str | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        retry_on_oom: bool = False,
        retry_on_lost: bool = False,
        **spec: Any,
    ) -> AsyncBatch:
        """Creates ``count`` sandboxes from one spec (see :meth:`warren.Client.batch`)."""
        return await self.batches.create(count, image, labels=labels, retry_on_oom=retry_on_oom, retry_on_lost=retry_on_lost, **spec)

    def events(
        self,
        *,
        follow: bool = False,
        sandbox: str | None = None,
        labels: Labels | None = None,
        batch: str | None = None,
        type: str | None = None,
        after: int = 0,
    ) -> AsyncEventStream:
        """Events as an async iterator (see :meth:`warren.Client.events`)."""
        return AsyncEventStream(self, sandbox, labels, batch, type, after, follow)

    async def whoami(self) -> models.WhoAmI:
        return await self._call(core.whoami_call())

    async def audit(
        self,
        tenant: str | None = None,
        since: Seconds | None = None,
        until: Seconds | None = None,
        limit: int | None = None,
    ) -> builtins.list[models.AuditEntry]:
        """As :meth:`warren.Client.audit`."""
        return await self._call(core.audit_call(tenant, since, until, limit))

    def logs(self, labels: Labels, since: Seconds | None = None) -> AsyncLogStream:
        """The logs of every sandbox matching ``labels``, as an async iterator
        (``since``: as :meth:`warren.Client.logs`)."""
        return AsyncLogStream(self, core.logs_by_label_call(labels, since))

    async def run(
        self,
        image: str | None,
        cmd: Cmd,
        *,
        stdin: bytes | str | None = None,
        timeout: Seconds | None = None,
        check: bool = False,
        raise_on_timeout: bool = True,
        **spec: Any,
    ) -> models.ExecResult:
        """Runs ``cmd`` in a sandbox made for it and removed after it, in one
        request (see :meth:`warren.Client.run`)."""
        collector = core.ExecCollector()
        resp = await self._send(core.run_call(image, cmd, stdin, timeout, spec))
        async for line in self._lines(resp):
            core.feed_run_line(collector, line)
        return core.finish_exec(collector, raise_on_timeout, check)

    async def nodes(self) -> list[models.Node]:
        return await self._call(core.nodes_call())

    async def health(self) -> str:
        return await self._call(core.health_call())

    async def openapi(self) -> dict[str, Any]:
        return await self._call(core.openapi_call())

    async def close(self) -> None:
        """Stops the lease keeper and closes the connection pool."""
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._keeper
        await self._http.aclose()

    aclose = close

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _Creating:
    """``client.sandbox(...)``: await it for the sandbox, or ``async with`` it."""

    def __init__(self, coro: Awaitable[AsyncSandbox]) -> None:
        self._coro = coro
        self._sb: AsyncSandbox | None = None

    def __await__(self) -> Generator[Any, None, AsyncSandbox]:
        return self._coro.__await__()

    async def __aenter__(self) -> AsyncSandbox:
        self._sb = await self._coro
        return self._sb

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self._sb is not None:
            await self._sb.__aexit__(et, ev, tb)


class AsyncSandboxes:
    """``client.sandboxes``: create, find and delete sandboxes."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(self, image: str | None = None, *, keep_alive: bool = True, wait: bool = True, **spec: Any) -> AsyncSandbox:
        info = await self._c._call(core.create_call(core.spec_body(image, spec), wait=wait))
        sb = AsyncSandbox(self._c, info)
        if keep_alive:
            sb.keep_alive()
        return sb

    async def get(self, sandbox_id: str) -> AsyncSandbox:
        return AsyncSandbox(self._c, await self._c._call(core.get_call(sandbox_id)))

    async def list(
        self,
        labels: Labels | None = None,
        *,
        state: str | Sequence[str] | None = None,
        all: bool = False,
    ) -> list[AsyncSandbox]:
        return [AsyncSandbox(self._c, i) for i in await self._c._call(core.list_call(labels, state, all))]

    async def delete(self, labels: Labels) -> builtins.list[models.SandboxInfo]:
        return await self._c._call(core.delete_many_call(labels))


class AsyncSandbox:
    """A handle on one sandbox (see :class:`warren.Sandbox`)."""

    def __init__(self, client: AsyncClient, info: models.SandboxInfo) -> None:
        self._c = client
        self.info = info
        self.id = info.id
        self.files = AsyncFiles(self)
        self.network = AsyncNetwork(self)

    def __repr__(self) -> str:
        return f"<AsyncSandbox {self.id} {self.info.state}>"

    @property
    def state(self) -> str:
        return self.info.state

    @property
    def labels(self) -> dict[str, str]:
        return self.info.spec.labels

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self._c._unkeep(self.id)
        if core.reclaim_on_exit(self.info.spec, et is not None):
            with contextlib.suppress(errors.NotFound):
                await self.destroy()

    async def destroy(self) -> models.SandboxInfo:
        self._c._unkeep(self.id)
        self.info = await self._c._call(core.delete_call(self.id))
        return self.info

    delete = destroy

    async def refresh(self) -> models.SandboxInfo:
        self.info = await self._c._call(core.get_call(self.id))
        return self.info

    async def usage(self) -> models.Usage:
        return (await self.refresh()).usage or models.Usage()

    async def pause(self) -> models.SandboxInfo:
        self.info = await self._c._call(core.action_call(self.id, "pause"))
        return self.info

    async def resume(self) -> models.SandboxInfo:
        self.info = await self._c._call(core.action_call(self.id, "resume"))
        return self.info

    async def set_ttl(self, ttl: Seconds) -> models.SandboxInfo:
        self.info = await self._c._call(core.ttl_call(self.id, ttl))
        return self.info

    async def set_reclaim(self, reclaim: str, keep_for: Seconds | None = None) -> models.SandboxInfo:
        self.info = await self._c._call(core.reclaim_call(self.id, reclaim, keep_for))
        return self.info

    async def heartbeat(self) -> models.SandboxInfo:
        self.info = await self._c._call(core.action_call(self.id, "heartbeat"))
        return self.info

    def keep_alive(self, enabled: bool = True) -> None:
        """Heartbeats a sandbox with a ``lease`` from the client's keeper task."""
        lease = core.lease_seconds(self.info)
        if enabled and lease:
            self._c._keep(self.id, lease)
        else:
            self._c._unkeep(self.id)

    async def wait(self, timeout: float | None = None, interval: float = 0.2) -> models.SandboxInfo:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            info = await self.refresh()
            if info.is_final or info.state == "kept":
                return info
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"sandbox {self.id} still {info.state} after {timeout}s")
            await asyncio.sleep(interval)

    async def exec(
        self,
        cmd: Cmd,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: Seconds | None = None,
        stdin: bytes | str | None = None,
        user: str | None = None,
        check: bool = False,
        raise_on_timeout: bool = True,
    ) -> models.ExecResult:
        """Runs ``cmd`` and returns its result (see :meth:`warren.Sandbox.exec`)."""
        async with await self.exec_stream(cmd, env=env, cwd=cwd, timeout=timeout, stdin=stdin, user=user) as s:
            async for _ in s:
                pass
            return core.finish_exec(s._collector, raise_on_timeout, check)

    async def exec_stream(
        self,
        cmd: Cmd,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: Seconds | None = None,
        stdin: bytes | str | None = None,
        user: str | None = None,
        stdin_open: bool = False,
        tty: bool = False,
        rows: int | None = None,
        cols: int | None = None,
    ) -> AsyncExecStream:
        """Starts ``cmd``; ``async for ev in stream`` yields its events as they
        happen. ``stdin_open`` keeps its stdin open for :meth:`AsyncExecStream.send_stdin`;
        ``tty`` runs it on a terminal (see :meth:`warren.Sandbox.exec_stream`),
        resized with :meth:`AsyncExecStream.resize`."""
        call = core.exec_call(self.id, cmd, env, cwd, timeout, stdin, user, stdin_open, tty, rows, cols)
        return AsyncExecStream(self._c, await self._c._send(call), self.id)

    async def spawn(
        self,
        cmd: Cmd,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: Seconds | None = None,
        user: str | None = None,
        stdin: bool = False,
    ) -> AsyncProcess:
        """Starts ``cmd`` in the background; its output is read by a task as
        it comes (see :meth:`warren.Sandbox.spawn`)."""
        stream = await self.exec_stream(cmd, env=env, cwd=cwd, timeout=timeout, user=user, stdin_open=stdin)
        proc = AsyncProcess(self, stream, stdin)
        await proc._start()
        return proc

    async def logs(self) -> list[models.LogLine]:
        async with self.follow_logs(follow=False) as s:
            return [line async for line in s]

    async def usage_history(self) -> list[models.UsageSample]:
        return await self._c._call(core.usage_history_call(self.id))

    def follow_logs(self, follow: bool = True) -> AsyncLogStream:
        return AsyncLogStream(self._c, core.logs_call(self.id, follow))

    def port(self, port: int) -> AsyncPort:
        return AsyncPort(self, port)

    async def commit(self, name: str) -> models.Image:
        return await self._c._call(core.commit_call(self.id, name))

    async def fork(
        self, count: int = 1, *, labels: Mapping[str, str] | None = None, keep_alive: bool = True, **overrides: Any
    ) -> list[AsyncSandbox]:
        """See :meth:`warren.Sandbox.fork`."""
        infos = await self._c._call(core.fork_call(self.id, count, labels, overrides))
        children = [AsyncSandbox(self._c, i) for i in infos]
        if keep_alive:
            for child in children:
                child.keep_alive()
        return children


class AsyncExecStream:
    """The events of a running command, as an async iterator and context manager."""

    def __init__(self, client: AsyncClient, resp: httpx.Response, sandbox_id: str = "") -> None:
        self._c = client
        self._resp = resp
        self._sandbox_id = sandbox_id
        self._lines = client._lines(resp)
        self._collector = core.ExecCollector()
        self._done = False
        # Events read ahead while waiting for the start; iteration gives
        # them first.
        self._ahead: collections.deque[models.ExecEvent] = collections.deque()

    def __aiter__(self) -> AsyncExecStream:
        return self

    async def __anext__(self) -> models.ExecEvent:
        if self._ahead:
            return self._ahead.popleft()
        while not self._done:
            try:
                line = await self._lines.__anext__()
            except StopAsyncIteration:
                self._done = True
                break
            ev = core.parse_exec_line(line)
            if ev is None:
                continue
            self._collector.feed(ev)
            if isinstance(ev, models.ExecExit):
                await self.close()
            return ev
        raise StopAsyncIteration

    @property
    def exec_id(self) -> str | None:
        return self._collector.start.exec_id if self._collector.start else None

    @property
    def pid(self) -> int | None:
        return self._collector.start.pid if self._collector.start else None

    @property
    def result(self) -> models.ExecResult:
        return self._collector.result()

    async def close(self) -> None:
        """Closes the stream; a command still running is killed (its whole tree)."""
        if not self._done and self._collector.exit is None:
            await self._kill()
        self._done = True
        await self._resp.aclose()

    async def send_stdin(self, data: bytes | str) -> None:
        """Writes ``data`` to the command's stdin (started with
        ``stdin_open=True``); sends arrive in order."""
        await self._stdin_call(data, close=False)

    async def close_stdin(self) -> None:
        """Ends the command's stdin (it reads end-of-file; on a terminal
        this sends ^D)."""
        await self._stdin_call(b"", close=True)

    async def resize(self, rows: int, cols: int) -> None:
        """Sets the window size of the command's terminal (started with
        ``tty=True``); its foreground process gets SIGWINCH."""
        await self._c._call(core.exec_resize_call(self._sandbox_id, await self._started_id(), rows, cols))

    async def _started_id(self) -> str:
        """The exec's id, once its start event came: read ahead for it
        (what is read stays for iteration)."""
        while self.exec_id is None and not self._done:
            read = self._ahead
            self._ahead = collections.deque()
            try:
                ev = await self.__anext__()
            except StopAsyncIteration:
                break
            finally:
                self._ahead = read
            self._ahead.append(ev)
        if self.exec_id is None:
            raise errors.WarrenError("the command ended before it started (see the stream's error)")
        return self.exec_id

    async def _stdin_call(self, data: bytes | str, close: bool) -> None:
        await self._c._call(core.exec_stdin_call(self._sandbox_id, await self._started_id(), data, close))

    async def _kill(self) -> None:
        if self._collector.start is not None and self._sandbox_id:
            with contextlib.suppress(errors.WarrenError):
                await self._c._call(core.exec_call(self._sandbox_id, core.kill_cmd(self._collector.start.pid), timeout=10))

    async def __aenter__(self) -> AsyncExecStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncProcess:
    """A command running in the background, its output drained by a task."""

    def __init__(self, sandbox: AsyncSandbox, stream: AsyncExecStream, stdin: bool) -> None:
        self._sb = sandbox
        self._stream = stream
        self._stdin = stdin
        self._killed = False
        self._started = asyncio.get_running_loop().create_future()
        self._task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        try:
            async for ev in self._stream:
                if isinstance(ev, models.ExecStart) and not self._started.done():
                    self._started.set_result(None)
        finally:
            if not self._started.done():
                self._started.set_result(None)

    async def _start(self) -> None:
        await asyncio.shield(self._started)

    @property
    def pid(self) -> int | None:
        return self._stream.pid

    @property
    def stdout(self) -> bytes:
        """Output so far."""
        return bytes(self._stream._collector.stdout)

    @property
    def stderr(self) -> bytes:
        return bytes(self._stream._collector.stderr)

    @property
    def returncode(self) -> int | None:
        if self._stream._collector.exit:
            return self._stream._collector.exit.code
        return 137 if self._killed else None

    async def wait(self, check: bool = False) -> models.ExecResult:
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        if self._task.done() and not self._task.cancelled() and self._task.exception() is not None:
            raise self._task.exception()  # type: ignore[misc]
        col = self._stream._collector
        if self._killed and col.exit is None:
            col.exit = models.ExecExit(code=137, duration_ms=0, signal=9)
        res = col.result()
        return res.check() if check else res

    async def kill(self) -> None:
        """Kills the command and everything it started; :meth:`wait` then
        reports its end (exit code 137)."""
        if self._task.done():
            return
        self._killed = True
        await self._stream._kill()

    async def send_stdin(self, data: bytes | str) -> None:
        """Writes ``data`` to the command's stdin (spawned with ``stdin=True``)."""
        if not self._stdin:
            raise errors.WarrenError("spawn the process with stdin=True to send it input")
        await self._stream.send_stdin(data)

    async def close_stdin(self) -> None:
        """Ends the command's stdin (it reads end-of-file)."""
        if not self._stdin:
            raise errors.WarrenError("spawn the process with stdin=True to send it input")
        await self._stream.close_stdin()


class AsyncFiles:
    """``sandbox.files`` (see :class:`warren.Files`), awaited."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox
        self._c = sandbox._c

    async def write(self, path: str, data: bytes | str | IO[bytes] | Iterable[bytes] | AsyncIterator[bytes], *, mode: int | str | None = None) -> None:
        await self._c._send(core.file_put_call(self._sb.id, path, core.upload_content(data), mode))

    async def upload(self, local_path: str | os.PathLike[str], path: str, *, mode: int | str | None = None) -> None:
        if mode is None:
            mode = os.stat(local_path).st_mode & 0o7777
        await self._c._send(core.file_put_call(self._sb.id, path, core.local_chunks(local_path), mode))

    async def read(self, path: str) -> bytes:
        buf = bytearray()
        async for b in self.stream(path):
            buf.extend(b)
        return bytes(buf)

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return (await self.read(path)).decode(encoding)

    async def stream(self, path: str, chunk_size: int = core.CHUNK) -> AsyncIterator[bytes]:
        """``async for chunk in files.stream(path)``: the content as it arrives."""
        resp = await self._c._send(core.file_get_call(self._sb.id, path))
        try:
            async for b in resp.aiter_bytes(chunk_size):
                yield b
        except httpx.TransportError as e:
            raise core.transport_error(self._c.url, e) from e
        finally:
            await resp.aclose()

    async def download(self, path: str, local_path: str | os.PathLike[str] | IO[bytes]) -> None:
        if hasattr(local_path, "write"):
            async for b in self.stream(path):
                local_path.write(b)
            return
        tmp = Path(f"{os.fspath(local_path)}.part")
        with open(tmp, "wb") as f:
            async for b in self.stream(path):
                f.write(b)
        os.replace(tmp, local_path)

    async def _spool(self, path: str) -> IO[bytes]:
        resp = await self._c._send(core.file_get_call(self._sb.id, path))
        if not core.is_tar(resp):
            await resp.aclose()
            raise NotADirectoryError(path)
        spool = tempfile.SpooledTemporaryFile(max_size=8 << 20)
        try:
            async for b in resp.aiter_bytes():
                spool.write(b)
        finally:
            await resp.aclose()
        spool.seek(0)
        return spool

    async def stat(self, path: str) -> models.PathEntry:
        return core.one_entry(await self._c._call(core.path_call(self._sb.id, "stat", path=path)), "stat")

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
            return True
        except errors.NotFound:
            return False

    async def list(self, path: str, depth: int = 1) -> builtins.list[models.PathEntry]:
        return await self._c._call(core.list_dir_call(self._sb.id, path, depth))

    async def mkdir(self, path: str) -> models.PathEntry:
        return core.one_entry(await self._c._call(core.path_call(self._sb.id, "make_dir", path=path)), "mkdir")

    async def rename(self, src: str, dst: str) -> models.PathEntry:
        return core.one_entry(await self._c._call(core.rename_call(self._sb.id, src, dst)), "rename")

    async def set_attrs(
        self, path: str, *, uid: int | None = None, gid: int | None = None, mode: int | None = None
    ) -> models.PathEntry:
        return core.one_entry(await self._c._call(core.set_attrs_call(self._sb.id, path, uid, gid, mode)), "set_attrs")

    async def remove(self, path: str) -> None:
        await self._c._call(core.path_call(self._sb.id, "remove", path=path))

    async def upload_dir(self, local_dir: str | os.PathLike[str], path: str) -> None:
        await self._c._send(core.file_put_call(self._sb.id, path, core.tar_stream(local_dir), tar=True))

    async def download_dir(self, path: str, local_dir: str | os.PathLike[str]) -> None:
        # Spooled (to disk past 8 MiB), then unpacked off the event loop.
        with await self._spool(path) as f:
            await asyncio.to_thread(core.extract_tar, f, local_dir)


class AsyncNetwork:
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def set(self, allow: Sequence[str] = (), deny: Sequence[str] = ()) -> models.NetworkChange:
        change = await self._sb._c._call(core.network_call(self._sb.id, allow, deny))
        self._sb.info = change.sandbox
        return change


class AsyncPort:
    """A TCP port inside a sandbox (see :class:`warren.Port`)."""

    def __init__(self, sandbox: AsyncSandbox, port: int) -> None:
        self._sb = sandbox
        self.port = int(port)
        self.url = f"{sandbox._c.url}{core.port_path(sandbox.id, self.port)}"

    async def request(self, method: str, path: str = "/", **kwargs: Any) -> httpx.Response:
        c = self._sb._c
        try:
            return await c._http.request(method, core.port_path(self._sb.id, self.port, path), **kwargs)
        except httpx.TransportError as e:
            raise core.transport_error(c.url, e) from e

    async def get(self, path: str = "/", **kwargs: Any) -> httpx.Response:
        return await self.request("GET", path, **kwargs)

    async def post(self, path: str = "/", **kwargs: Any) -> httpx.Response:
        return await self.request("POST", path, **kwargs)

    async def browser_link(self) -> str:
        return await self._sb._c._call(core.port_link_call(self._sb.id, self.port))

    async def connect(self, timeout: float | None = 10.0) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A raw tunnel to the port, as asyncio streams."""
        c = self._sb._c
        ep = core.endpoint(c.url)
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(ep.host, ep.port, ssl=ssl.create_default_context() if ep.tls else None),
                timeout,
            )
            writer.write(core.upgrade_request(ep, c._cfg.token, self._sb.id, self.port))
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as e:
            raise core.transport_error(c.url, e) from e
        status, headers = core.upgrade_head(head)
        if status != 101:
            body = await reader.read(int(headers.get("content-length", "0")) or -1)
            writer.close()
            raise core.upgrade_error(status, headers, body)
        return reader, writer


class _AsyncLineStream:
    def __init__(self, client: AsyncClient, call: Call[None]) -> None:
        self._c = client
        self._call = call
        self._resp: httpx.Response | None = None

    async def _open(self) -> AsyncIterator[str]:
        self._resp = await self._c._send(self._call)
        return self._c._lines(self._resp)

    async def close(self) -> None:
        if self._resp is not None:
            await self._resp.aclose()


class AsyncLogStream(_AsyncLineStream):
    async def __aiter__(self) -> AsyncIterator[models.LogLine]:
        async for line in await self._open():
            parsed = core.parse_log_line(line)
            if parsed is not None:
                yield parsed

    async def __aenter__(self) -> AsyncLogStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncEventStream:
    """Events as an async iterator (see :meth:`AsyncClient.events`)."""

    def __init__(
        self,
        client: AsyncClient,
        sandbox: str | None,
        labels: Labels | None,
        batch: str | None,
        type: str | None,
        after: int,
        follow: bool,
    ) -> None:
        self._c = client
        self._args = (sandbox, labels, batch, type)
        self.last_seq = after
        self._follow = follow
        self._resp: httpx.Response | None = None
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[models.Event]:
        sandbox, labels, batch, type = self._args
        call = core.events_call(sandbox, labels, batch, type, self.last_seq, self._follow)
        if self._follow:
            self._resp = await self._c._send(call)
            async for line in self._c._lines(self._resp):
                ev = core.parse_event(line)
                if ev is not None:
                    self.last_seq = ev.seq
                    yield ev
            return
        while not self._closed:
            page = await self._c._call(call)
            for ev in page:
                self.last_seq = ev.seq
                yield ev
            if not page:
                return
            call = core.events_call(sandbox, labels, batch, type, self.last_seq, False)

    async def close(self) -> None:
        self._closed = True
        if self._resp is not None:
            await self._resp.aclose()

    async def __aenter__(self) -> AsyncEventStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncBatches:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(
        self,
        count: int,
        image: str | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        retry_on_oom: bool = False,
        retry_on_lost: bool = False,
        **spec: Any,
    ) -> AsyncBatch:
        body = core.spec_body(image, spec)
        return AsyncBatch(self._c, await self._c._call(core.batch_create_call(count, body, labels, retry_on_oom, retry_on_lost)))

    async def get(self, batch_id: str) -> AsyncBatch:
        return AsyncBatch(self._c, await self._c._call(core.batch_get_call(batch_id)))

    async def list(self) -> list[AsyncBatch]:
        return [AsyncBatch(self._c, i) for i in await self._c._call(core.batch_list_call())]


class AsyncBatch:
    """A batch of sandboxes (see :class:`warren.Batch`)."""

    def __init__(self, client: AsyncClient, info: models.BatchInfo) -> None:
        self._c = client
        self.info = info
        self.id = info.id

    def __repr__(self) -> str:
        return f"<AsyncBatch {self.id} {self.info.submitted}/{self.info.count} {self.info.states}>"

    @property
    def counts(self) -> dict[str, int]:
        return dict(self.info.states)

    async def refresh(self) -> models.BatchInfo:
        self.info = await self._c._call(core.batch_get_call(self.id))
        return self.info

    async def watch(self, until: str | None = None, interval: float = 0.25) -> AsyncIterator[models.BatchInfo]:
        until = until or ("done" if self.info.spec.cmd else "ready")
        last: Any = None
        while True:
            info = await self.refresh()
            key = (info.submitted, sorted(info.states.items()), len(info.failures))
            if key != last:
                last = key
                yield info
            if core.batch_done(info, until):
                return
            await asyncio.sleep(interval)

    async def wait(
        self,
        until: str | None = None,
        *,
        timeout: float | None = None,
        on_progress: Callable[[models.BatchInfo], None] | None = None,
        interval: float = 0.25,
    ) -> models.BatchInfo:
        deadline = None if timeout is None else time.monotonic() + timeout
        async for info in self.watch(until, interval):
            if on_progress is not None:
                on_progress(info)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"batch {self.id} not {until or 'settled'} after {timeout}s: {info.states}")
        return self.info

    async def sandboxes(self, *, state: str | Sequence[str] | None = None, all: bool = False) -> list[AsyncSandbox]:
        return await self._c.sandboxes.list({core.BATCH_LABEL: self.id}, state=state, all=all)

    def events(self, follow: bool = False) -> AsyncEventStream:
        return self._c.events(batch=self.id, follow=follow)

    async def delete(self) -> models.BatchInfo:
        self.info = await self._c._call(core.batch_delete_call(self.id))
        return self.info


class AsyncImages:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def list(self) -> list[models.Image]:
        return await self._c._call(core.images_list_call())

    async def pull(self, reference: str, *, on_progress: Callable[[models.PullEvent], None] | None = None) -> models.Image:
        if on_progress is None:
            return await self._c._call(core.image_pull_call(reference, False))
        resp = await self._c._send(core.image_pull_call(reference, True))
        async for line in self._c._lines(resp):
            item = core.pull_line(line)
            if isinstance(item, models.Image):
                return item
            if item is not None:
                on_progress(item)
        raise errors.StreamError(f"the pull of {reference} ended without an answer")

    async def prewarm(self, reference: str, nodes: Sequence[str] | None = None) -> models.PrewarmResult:
        return await self._c._call(core.image_prewarm_call(reference, nodes))

    async def import_(self, name: str, archive: str | os.PathLike[str] | IO[bytes]) -> models.Image:
        content = core.local_chunks(archive) if isinstance(archive, (str, os.PathLike)) else core.read_chunks(archive)
        return await self._c._call(core.image_import_call(name, content))

    async def build(
        self,
        context: str | os.PathLike[str],
        *,
        tag: str | None = None,
        dockerfile: str = "Dockerfile",
        build_args: Mapping[str, str] | None = None,
        target: str | None = None,
        allow: Sequence[str] | None = None,
        test: str | None = None,
        push: str | None = None,
        no_cache: bool = False,
        on_event: Callable[[models.BuildEvent], None] | None = None,
    ) -> models.BuildResult:
        """:meth:`Images.build`, awaited."""
        call = core.build_call(context, tag, dockerfile, build_args, target, allow, test, push, no_cache)
        tracker = core.BuildTracker()
        resp = await self._c._send(call)
        async for line in self._c._lines(resp):
            ev = tracker.line(line)
            if ev is not None and on_event is not None:
                on_event(ev)
        return tracker.result()

    async def push(self, reference: str, source: str | None = None) -> models.PushResult:
        return await self._c._call(core.image_push_call(reference, source))

    async def delete(self, reference: str) -> models.Image:
        return await self._c._call(core.image_delete_call(reference))

    async def gc(self, budget: int | str | None = None) -> models.GcReport:
        return await self._c._call(core.image_gc_call(budget))


class AsyncProfiles:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def list(self) -> list[models.Profile]:
        return await self._c._call(core.profiles_list_call())

    async def get(self, name: str) -> models.ProfileDetail:
        return await self._c._call(core.profile_get_call(name))

    async def reset(self, name: str) -> models.Profile:
        return await self._c._call(core.profile_reset_call(name))

    async def export(self) -> str:
        return await self._c._call(core.profiles_export_call())

    async def import_(self, toml: str | bytes | os.PathLike[str]) -> builtins.list[models.Profile]:
        return await self._c._call(core.profiles_import_call(toml))


class AsyncVolumes:
    """``client.volumes`` (see :class:`warren.Volumes`)."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(self, name: str, size: str | int, *, node_selector: Mapping[str, str] | None = None) -> models.Volume:
        return await self._c._call(core.volume_create_call(name, size, node_selector))

    async def list(self) -> builtins.list[models.Volume]:
        return await self._c._call(core.volumes_list_call())

    async def remove(self, name: str) -> models.Volume:
        return await self._c._call(core.volume_delete_call(name))


class AsyncSecrets:
    """``client.secrets`` (see :class:`warren.Secrets`)."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(self, name: str, value: str, *, metadata: Mapping[str, str] | None = None) -> models.Secret:
        """Keeps a secret (version 1); raises :class:`Conflict` if the name is taken."""
        return await self._c._call(core.secret_put_call(name, value, metadata, create=True))

    async def set(self, name: str, value: str, *, metadata: Mapping[str, str] | None = None) -> models.Secret:
        """A new value (and metadata, when given): sandboxes made from now on get it."""
        return await self._c._call(core.secret_put_call(name, value, metadata, create=False))

    async def get(self, name: str) -> models.Secret:
        return await self._c._call(core.secret_get_call(name))

    async def list(self) -> builtins.list[models.Secret]:
        return await self._c._call(core.secrets_list_call())

    async def remove(self, name: str) -> models.Secret:
        """Removes a secret; sandboxes given it keep their copies."""
        return await self._c._call(core.secret_delete_call(name))


class AsyncTenants:
    """``client.tenants`` (see :class:`warren.Tenants`)."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(
        self,
        name: str,
        *,
        cpu: float | str | None = None,
        memory: int | str | None = None,
        gpus: int | None = None,
        sandboxes: int | None = None,
        weight: int = 1,
        priority: int = 0,
        preempt: bool = False,
        egress: Sequence[str] | None = None,
    ) -> models.Tenant:
        spec = core.tenant_spec(cpu, memory, gpus, sandboxes, weight, priority, preempt, egress)
        return await self._c._call(core.tenant_create_call(name, spec))

    async def set(
        self,
        name: str,
        *,
        cpu: float | str | None = None,
        memory: int | str | None = None,
        gpus: int | None = None,
        sandboxes: int | None = None,
        weight: int = 1,
        priority: int = 0,
        preempt: bool = False,
        egress: Sequence[str] | None = None,
    ) -> models.Tenant:
        spec = core.tenant_spec(cpu, memory, gpus, sandboxes, weight, priority, preempt, egress)
        return await self._c._call(core.tenant_set_call(name, spec))

    async def get(self, name: str) -> models.Tenant:
        return await self._c._call(core.tenant_get_call(name))

    async def list(self) -> builtins.list[models.Tenant]:
        return await self._c._call(core.tenants_list_call())

    async def remove(self, name: str) -> None:
        await self._c._call(core.tenant_delete_call(name))


class AsyncTokens:
    """``client.tokens`` (see :class:`warren.Tokens`)."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(self, tenant: str, role: str = "user", description: str = "") -> models.NewToken:
        return await self._c._call(core.token_create_call(tenant, role, description))

    async def list(self) -> builtins.list[models.Token]:
        return await self._c._call(core.tokens_list_call())

    async def revoke(self, token_id: str) -> models.Token:
        return await self._c._call(core.token_revoke_call(token_id))
