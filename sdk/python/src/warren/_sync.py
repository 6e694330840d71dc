"""The synchronous client. Every request and answer is described in
:mod:`warren._core`; this module only sends them (with httpx) and wraps the
answers in handles. :mod:`warren._async` is its asyncio twin."""

from __future__ import annotations

import builtins
import collections
import contextlib
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar

import httpx

from . import _core as core
from . import errors, models
from ._core import Call, Cmd, Labels, Seconds

T = TypeVar("T")

__all__ = [
    "Client",
    "Sandbox",
    "Sandboxes",
    "Files",
    "Network",
    "Port",
    "ExecStream",
    "Process",
    "Batch",
    "Batches",
    "Images",
    "Profiles",
    "Secrets",
    "Tenants",
    "Tokens",
    "Volumes",
    "EventStream",
    "LogStream",
]


class Client:
    """A connection to a Warren daemon (one connection pool, HTTP keep-alive).

    ``url`` and ``token`` default to ``WARREN_URL`` and ``WARREN_TOKEN``, then
    to ``http://127.0.0.1:7070`` and ``<home>/token`` (``home``:
    ``WARREN_HOME`` or ``/var/lib/warren``), as the CLI does.

    Thread-safe: share one client between threads. Use it as a context
    manager, or call :meth:`close`.

    >>> with warren.Client() as client, client.sandbox(image="busybox:latest") as sb:
    ...     print(sb.exec("echo hi").stdout_text)
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
        transport: httpx.BaseTransport | None = None,
        verify: bool | ssl.SSLContext = True,
    ) -> None:
        self._cfg = core.Config.resolve(url, token, home)
        self._http = httpx.Client(
            base_url=self._cfg.url,
            headers=self._cfg.headers(),
            timeout=core.default_timeout(timeout),
            limits=limits or core.default_limits(),
            transport=transport,
            verify=verify,
        )
        self._retry = core.RetryPolicy(max_retries=max_retries)
        self._leases = core.LeaseSchedule()
        self._lease_cv = threading.Condition()
        self._keeper: threading.Thread | None = None
        self._closed = False
        self.sandboxes = Sandboxes(self)
        """Sandboxes: ``create``, ``get``, ``list``, ``delete``."""
        self.batches = Batches(self)
        """Batches: ``create``, ``get``, ``list``."""
        self.images = Images(self)
        """Images: ``list``, ``pull``, ``prewarm``, ``import_``, ``push``, ``delete``, ``gc``."""
        self.profiles = Profiles(self)
        """Resource profiles: ``list``, ``get``, ``reset``, ``export``, ``import_``."""
        self.volumes = Volumes(self)
        """Volumes: ``create``, ``list``, ``remove``."""
        self.secrets = Secrets(self)
        """Secrets: ``create``, ``set``, ``get``, ``list``, ``remove``."""
        self.tenants = Tenants(self)
        """Tenants (the operator's token): ``create``, ``set``, ``get``, ``list``, ``remove``."""
        self.tokens = Tokens(self)
        """Tenants' tokens: ``create``, ``list``, ``revoke``."""

    @property
    def url(self) -> str:
        return self._cfg.url

    # ------------------------------------------------------------ plumbing

    def _send(self, call: Call[Any]) -> httpx.Response:
        """Sends ``call`` (retrying where its policy allows); returns a
        successful response, read unless ``call.stream``."""
        attempt = 0
        while True:
            resp: httpx.Response | None = None
            try:
                resp = self._http.send(call.request(self._http), stream=True)
                if not (resp.is_success and call.stream):
                    resp.read()
                    resp.close()
            except httpx.TransportError as e:
                if resp is not None:
                    resp.close()
                delay = self._retry.after_error(call, attempt, e)
                if delay is None:
                    raise core.transport_error(self._cfg.url, e) from e
            else:
                if resp.is_success:
                    if call.sandbox:
                        self._touched(call.sandbox)
                    return resp
                delay = self._retry.after_status(call, attempt, resp)
                if delay is None:
                    raise core.api_error(resp)
            attempt += 1
            time.sleep(delay)

    def _call(self, call: Call[T]) -> T:
        return call.parse(self._send(call))

    def _lines(self, resp: httpx.Response) -> Iterator[str]:
        try:
            yield from resp.iter_lines()
        except httpx.TransportError as e:
            raise core.transport_error(self._cfg.url, e) from e
        finally:
            resp.close()

    # ------------------------------------------------------------ lease keeper

    def _touched(self, sid: str) -> None:
        if len(self._leases):
            with self._lease_cv:
                self._leases.touched(sid, time.monotonic())

    def _keep(self, sid: str, lease: float) -> None:
        with self._lease_cv:
            self._leases.add(sid, lease, time.monotonic())
            if self._keeper is None:
                self._keeper = threading.Thread(target=self._keep_loop, name="warren-lease-keeper", daemon=True)
                self._keeper.start()
            self._lease_cv.notify()

    def _unkeep(self, sid: str) -> None:
        with self._lease_cv:
            self._leases.remove(sid)

    def _keep_loop(self) -> None:
        # One thread per client, however many sandboxes it keeps.
        while True:
            with self._lease_cv:
                while not self._closed:
                    now = time.monotonic()
                    due = self._leases.due(now)
                    if due:
                        for sid in due:
                            self._leases.touched(sid, now)
                        break
                    self._lease_cv.wait(self._leases.next_wake(now))
                if self._closed:
                    return
            for sid in due:
                try:
                    info = self._call(core.action_call(sid, "heartbeat"))
                    if info.is_final:
                        self._unkeep(sid)
                except errors.NotFound:
                    self._unkeep(sid)
                except errors.WarrenError:
                    pass  # tried again at the next beat

    # ------------------------------------------------------------ sandboxes

    def sandbox(
        self,
        image: str | None = None,
        *,
        keep_alive: bool = True,
        wait: bool = True,
        **spec: Any,
    ) -> Sandbox:
        """Creates a sandbox and returns it once an exec would succeed.

        ``spec`` takes the API's spec fields: ``cpu`` (cores or ``"500m"``),
        ``memory``/``disk`` (``"2G"`` or bytes), ``cpu_request`` and
        ``memory_request`` (what the scheduler reserves; ``cpu``/``memory``
        are the enforced limits), ``pids``, ``gpus``, ``devices`` (CDI
        names, e.g. ``["nvidia.com/gpu=0"]``), ``env``,
        ``labels``, ``ttl``/``lease``/``keep_for`` (seconds, ``"30m"`` or a
        ``timedelta``), ``reclaim``, ``profile``, ``cmd`` (argv, or a string
        for ``sh -c``), ``cwd``, ``user``, ``request_id``, ``network``, and
        ``allow=[…]``/``deny=[…]`` for an allowlist network.

        Use it as a context manager to destroy it on exit (as its
        ``reclaim`` policy says). With a ``lease``, the client heartbeats it
        while it is open (``keep_alive=False`` to leave that to you). A
        create is retried safely (it carries a request id) on 429/503.
        """
        return self.sandboxes.create(image, keep_alive=keep_alive, wait=wait, **spec)

    def batch(
        self,
        count: int,
        image: str | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        retry_on_oom: bool = False,
        retry_on_lost: bool = False,
        **spec: Any,
    ) -> Batch:
        """Creates ``count`` sandboxes from one spec (answers at once; the
        sandboxes are submitted in the background). ``labels`` are batch
        labels added to every member; ``spec`` as for :meth:`sandbox`."""
        return self.batches.create(count, image, labels=labels, retry_on_oom=retry_on_oom, retry_on_lost=retry_on_lost, **spec)

    def events(
        self,
        *,
        follow: bool = False,
        sandbox: str | None = None,
        labels: Labels | None = None,
        batch: str | None = None,
        type: str | None = None,
        after: int = 0,
    ) -> EventStream:
        """State-change events (with reasons) as an iterator; with
        ``follow=True`` it waits for new ones until closed. ``type`` matches
        a reason (``ttl_expired``) or a state (``destroyed``); ``after`` a
        sequence number to resume from."""
        return EventStream(self, sandbox, labels, batch, type, after, follow)

    def whoami(self) -> models.WhoAmI:
        """Who this client's token is: its tenant and role."""
        return self._call(core.whoami_call())

    def audit(
        self,
        tenant: str | None = None,
        since: Seconds | None = None,
        until: Seconds | None = None,
        limit: int | None = None,
    ) -> builtins.list[models.AuditEntry]:
        """The calls that changed something, oldest first: a tenant's token
        sees its own; ``since``/``until`` as seconds or ``"30m"`` ago, or
        RFC 3339."""
        return self._call(core.audit_call(tenant, since, until, limit))

    def logs(self, labels: Labels, since: Seconds | None = None) -> LogStream:
        """The logs of every sandbox (live or finished) matching ``labels``,
        one after another; every line names its sandbox. ``since``: only
        lines written this long ago or later (seconds, or ``"1h"``)."""
        return LogStream(self, core.logs_by_label_call(labels, since))

    def run(
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
        """Runs ``cmd`` in a sandbox made for it (``spec`` as for
        :meth:`sandbox`) and removed after it, in one request; returns once
        the sandbox is gone. ``timeout``, ``check`` and ``raise_on_timeout``
        as for :meth:`warren.Sandbox.exec`."""
        collector = core.ExecCollector()
        resp = self._send(core.run_call(image, cmd, stdin, timeout, spec))
        for line in self._lines(resp):
            core.feed_run_line(collector, line)
        return core.finish_exec(collector, raise_on_timeout, check)

    def nodes(self) -> list[models.Node]:
        """Nodes with their allocatable and allocated capacity and queue length."""
        return self._call(core.nodes_call())

    def health(self) -> str:
        """``ok``, or what start-up recovery is doing."""
        return self._call(core.health_call())

    def openapi(self) -> dict[str, Any]:
        """The daemon's OpenAPI document."""
        return self._call(core.openapi_call())

    # ------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Stops the lease keeper and closes the connection pool."""
        with self._lease_cv:
            self._closed = True
            self._lease_cv.notify_all()
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Sandboxes:
    """``client.sandboxes``: create, find and delete sandboxes."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self, image: str | None = None, *, keep_alive: bool = True, wait: bool = True, **spec: Any) -> Sandbox:
        """Same as :meth:`Client.sandbox`."""
        info = self._c._call(core.create_call(core.spec_body(image, spec), wait=wait))
        sb = Sandbox(self._c, info)
        if keep_alive:
            sb.keep_alive()
        return sb

    def get(self, sandbox_id: str) -> Sandbox:
        """A handle on an existing sandbox (spec, state, usage, events)."""
        return Sandbox(self._c, self._c._call(core.get_call(sandbox_id)))

    def list(
        self,
        labels: Labels | None = None,
        *,
        state: str | Sequence[str] | None = None,
        all: bool = False,
    ) -> list[Sandbox]:
        """Live sandboxes (or those in ``state``, or ``all`` of them) matching ``labels``."""
        return [Sandbox(self._c, i) for i in self._c._call(core.list_call(labels, state, all))]

    def delete(self, labels: Labels) -> builtins.list[models.SandboxInfo]:
        """Destroys every live sandbox matching ``labels`` (required)."""
        return self._c._call(core.delete_many_call(labels))


class Sandbox:
    """A handle on one sandbox. ``info`` is its last known description
    (:meth:`refresh` reads it again)."""

    def __init__(self, client: Client, info: models.SandboxInfo) -> None:
        self._c = client
        self.info = info
        self.id = info.id
        self.files = Files(self)
        """Files: ``write``, ``read``, ``stat``, ``list``, ``mkdir``, ``rename``, ``remove``, ``upload_dir``…"""
        self.network = Network(self)
        """Egress rules: ``network.set(allow=…, deny=…)``."""

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} {self.info.state}>"

    @property
    def state(self) -> str:
        """The state when ``info`` was last read."""
        return self.info.state

    @property
    def labels(self) -> dict[str, str]:
        return self.info.spec.labels

    # ------------------------------------------------------------ lifetime

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self._c._unkeep(self.id)
        if core.reclaim_on_exit(self.info.spec, et is not None):
            with contextlib.suppress(errors.NotFound):
                self.destroy()

    def destroy(self) -> models.SandboxInfo:
        """Destroys the sandbox now (idempotent)."""
        self._c._unkeep(self.id)
        self.info = self._c._call(core.delete_call(self.id))
        return self.info

    delete = destroy

    def refresh(self) -> models.SandboxInfo:
        """Reads spec, state, usage and events again."""
        self.info = self._c._call(core.get_call(self.id))
        return self.info

    def usage(self) -> models.Usage:
        """Current cgroup usage (CPU time, memory, pids, OOM kills, disk)."""
        return self.refresh().usage or models.Usage()

    def pause(self) -> models.SandboxInfo:
        """Freezes every process (exec answers 409 until :meth:`resume`)."""
        self.info = self._c._call(core.action_call(self.id, "pause"))
        return self.info

    def resume(self) -> models.SandboxInfo:
        self.info = self._c._call(core.action_call(self.id, "resume"))
        return self.info

    def set_ttl(self, ttl: Seconds) -> models.SandboxInfo:
        """The sandbox may live ``ttl`` from now (extends or shortens it)."""
        self.info = self._c._call(core.ttl_call(self.id, ttl))
        return self.info

    def set_reclaim(self, reclaim: str, keep_for: Seconds | None = None) -> models.SandboxInfo:
        """What happens when the sandbox ends: ``"destroy"``, ``"delay"``,
        ``"keep"`` (frozen and inspectable for ``keep_for``) or
        ``"keep_on_failure"``."""
        self.info = self._c._call(core.reclaim_call(self.id, reclaim, keep_for))
        return self.info

    def heartbeat(self) -> models.SandboxInfo:
        """Renews the lease (any call on the sandbox does too)."""
        self.info = self._c._call(core.action_call(self.id, "heartbeat"))
        return self.info

    def keep_alive(self, enabled: bool = True) -> None:
        """Heartbeats a sandbox with a ``lease`` from the client's keeper
        thread (one per client) until it is destroyed or this is turned off."""
        lease = core.lease_seconds(self.info)
        if enabled and lease:
            self._c._keep(self.id, lease)
        else:
            self._c._unkeep(self.id)

    def wait(self, timeout: float | None = None, interval: float = 0.2) -> models.SandboxInfo:
        """Waits until the sandbox is finished (destroyed, failed, lost or kept),
        e.g. one whose main ``cmd`` runs to its end."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            info = self.refresh()
            if info.is_final or info.state == "kept":
                return info
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"sandbox {self.id} still {info.state} after {timeout}s")
            time.sleep(interval)

    # ------------------------------------------------------------ exec

    def exec(
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
        """Runs ``cmd`` (an argv list, or a string run by ``sh -c``) and
        returns its output and exit code.

        ``timeout`` kills the command's whole process tree; then
        :class:`~warren.ExecTimeout` is raised carrying the output so far
        (or, with ``raise_on_timeout=False``, the result has ``timed_out``).
        ``check=True`` raises :class:`~warren.CommandFailed` on a non-zero exit.
        """
        with self.exec_stream(cmd, env=env, cwd=cwd, timeout=timeout, stdin=stdin, user=user) as s:
            for _ in s:
                pass
            return core.finish_exec(s._collector, raise_on_timeout, check)

    def exec_stream(
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
    ) -> ExecStream:
        """Starts ``cmd`` and returns a stream of its events as they happen:
        :class:`~warren.models.ExecStart`, :class:`~warren.models.ExecOutput`
        (stdout and stderr interleaved as produced, bytes), then
        :class:`~warren.models.ExecExit`. Closing the stream early kills the
        command. ``stdin_open`` keeps its stdin open after ``stdin`` for
        :meth:`ExecStream.send_stdin`. ``tty`` runs it on a terminal of the
        sandbox (``rows`` x ``cols``, default 24x80; all output arrives as
        stdout, with the terminal's ``\\r\\n``), resized with
        :meth:`ExecStream.resize`."""
        call = core.exec_call(self.id, cmd, env, cwd, timeout, stdin, user, stdin_open, tty, rows, cols)
        return ExecStream(self._c, self._c._send(call), self.id)

    def spawn(
        self,
        cmd: Cmd,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: Seconds | None = None,
        user: str | None = None,
        stdin: bool = False,
    ) -> Process:
        """Starts ``cmd`` in the background and returns a :class:`Process`
        handle (``wait``, ``kill``, ``send_stdin``). Its output is read when
        you ``wait`` or iterate (as with ``subprocess.Popen``'s pipes, a
        process that writes much more than a socket buffer pauses until
        then; send chatty output to a file). ``stdin=True`` lets you feed it
        input later with ``send_stdin`` and end it with ``close_stdin``."""
        stream = self.exec_stream(cmd, env=env, cwd=cwd, timeout=timeout, user=user, stdin_open=stdin)
        proc = Process(self, stream, stdin)
        proc._await_start()
        return proc

    # ------------------------------------------------------------ the rest

    def logs(self) -> list[models.LogLine]:
        """The sandbox's log so far: output, state events, the usage summary."""
        with self.follow_logs(follow=False) as s:
            return list(s)

    def usage_history(self) -> list[models.UsageSample]:
        """The usage samples kept of the sandbox, oldest first, whether or
        not it or its node still exists."""
        return self._c._call(core.usage_history_call(self.id))

    def follow_logs(self, follow: bool = True) -> LogStream:
        """The log as a stream; with ``follow`` it stays open until the sandbox ends."""
        return LogStream(self._c, core.logs_call(self.id, follow))

    def port(self, port: int) -> Port:
        """A server listening on ``port`` inside the sandbox: HTTP requests
        through the daemon, or a raw tunnelled socket (:meth:`Port.connect`)."""
        return Port(self, port)

    def commit(self, name: str) -> models.Image:
        """Stores the sandbox's filesystem changes as image ``name`` (``repo:tag``)."""
        return self._c._call(core.commit_call(self.id, name))

    def fork(
        self, count: int = 1, *, labels: Mapping[str, str] | None = None, keep_alive: bool = True, **overrides: Any
    ) -> list[Sandbox]:
        """``count`` new sandboxes that start from this one's filesystem as
        it is now (a running sandbox is frozen while its changes are
        copied, once): each writes to a layer of its own, unseen by this
        sandbox and the others. Processes are not carried over (each child
        runs the source's main ``cmd`` anew, if it has one), unless
        ``with_processes=True``: a gvisor source on network none is saved
        and resumed, and each child resumes its memory and processes too.
        ``labels`` are added over the source's; ``cpu``, ``memory``,
        ``cpu_request``, ``memory_request``, ``pids``, ``disk``, ``ttl`` and
        ``lease`` replace the source's. All or none: the children once every
        one is running."""
        infos = self._c._call(core.fork_call(self.id, count, labels, overrides))
        children = [Sandbox(self._c, i) for i in infos]
        if keep_alive:
            for child in children:
                child.keep_alive()
        return children


class ExecStream:
    """The events of a running command, as an iterator and context manager.
    After it is exhausted, :attr:`result` holds the whole outcome."""

    def __init__(self, client: Client, resp: httpx.Response, sandbox_id: str = "") -> None:
        self._c = client
        self._resp = resp
        self._sandbox_id = sandbox_id
        self._lines = client._lines(resp)
        self._collector = core.ExecCollector()
        self._done = False
        # Events read ahead while waiting for the start; iteration gives
        # them first.
        self._ahead: collections.deque[models.ExecEvent] = collections.deque()

    def __iter__(self) -> Iterator[models.ExecEvent]:
        return self

    def __next__(self) -> models.ExecEvent:
        if self._ahead:
            return self._ahead.popleft()
        while not self._done:
            try:
                line = next(self._lines)
            except StopIteration:
                self._done = True
                break
            ev = core.parse_exec_line(line)
            if ev is None:
                continue
            self._collector.feed(ev)
            if isinstance(ev, models.ExecExit):
                self.close()
            return ev
        raise StopIteration

    @property
    def exec_id(self) -> str | None:
        return self._collector.start.exec_id if self._collector.start else None

    @property
    def pid(self) -> int | None:
        """The command's pid inside the sandbox."""
        return self._collector.start.pid if self._collector.start else None

    @property
    def result(self) -> models.ExecResult:
        """The outcome (raises :class:`~warren.StreamError` before the exit event)."""
        return self._collector.result()

    def close(self) -> None:
        """Closes the stream; a command still running is killed (its whole tree)."""
        if not self._done and self._collector.exit is None:
            self._kill()
        self._done = True
        self._resp.close()

    def send_stdin(self, data: bytes | str) -> None:
        """Writes ``data`` to the command's stdin (started with
        ``stdin_open=True``); sends arrive in order."""
        self._stdin_call(data, close=False)

    def close_stdin(self) -> None:
        """Ends the command's stdin (it reads end-of-file; on a terminal
        this sends ^D)."""
        self._stdin_call(b"", close=True)

    def resize(self, rows: int, cols: int) -> None:
        """Sets the window size of the command's terminal (started with
        ``tty=True``); its foreground process gets SIGWINCH."""
        self._c._call(core.exec_resize_call(self._sandbox_id, self._started_id(), rows, cols))

    def _started_id(self) -> str:
        """The exec's id, once its start event came: read ahead for it
        (what is read stays for iteration)."""
        while self.exec_id is None and not self._done:
            read = self._ahead
            self._ahead = collections.deque()
            try:
                ev = next(self)
            except StopIteration:
                break
            finally:
                self._ahead = read
            self._ahead.append(ev)
        if self.exec_id is None:
            raise errors.WarrenError("the command ended before it started (see the stream's error)")
        return self.exec_id

    def _stdin_call(self, data: bytes | str, close: bool) -> None:
        self._c._call(core.exec_stdin_call(self._sandbox_id, self._started_id(), data, close))

    def _kill(self) -> None:
        if self._collector.start is not None and self._sandbox_id:
            with contextlib.suppress(errors.WarrenError):
                self._c._call(core.exec_call(self._sandbox_id, core.kill_cmd(self._collector.start.pid), timeout=10))

    def __enter__(self) -> ExecStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Process(ExecStream):
    """A command running in the background (see :meth:`Sandbox.spawn`)."""

    def __init__(self, sandbox: Sandbox, stream: ExecStream, stdin: bool) -> None:
        super().__init__(stream._c, stream._resp, sandbox.id)
        self._lines = stream._lines
        self._sb = sandbox
        self._stdin = stdin
        self._killed = False

    def _await_start(self) -> None:
        for ev in self:
            if isinstance(ev, models.ExecStart) or self._done:
                return

    @property
    def stdout(self) -> bytes:
        """Output read so far."""
        return bytes(self._collector.stdout)

    @property
    def stderr(self) -> bytes:
        return bytes(self._collector.stderr)

    @property
    def returncode(self) -> int | None:
        """The exit code once known (137 after :meth:`kill`)."""
        if self._collector.exit:
            return self._collector.exit.code
        return 137 if self._killed else None

    def wait(self, check: bool = False) -> models.ExecResult:
        """Reads the rest of its output and waits for it to exit."""
        for _ in self:
            pass
        if self._killed and self._collector.exit is None:
            self._collector.exit = models.ExecExit(code=137, duration_ms=0, signal=9)
        res = self._collector.result()
        return res.check() if check else res

    def kill(self) -> None:
        """Kills the command and everything it started; :meth:`wait` then
        reports its end (exit code 137)."""
        if self._done:
            return
        self._killed = True
        self._kill()

    def send_stdin(self, data: bytes | str) -> None:
        """Writes ``data`` to the command's stdin (spawned with ``stdin=True``)."""
        if not self._stdin:
            raise errors.WarrenError("spawn the process with stdin=True to send it input")
        super().send_stdin(data)

    def close_stdin(self) -> None:
        """Ends the command's stdin (it reads end-of-file)."""
        if not self._stdin:
            raise errors.WarrenError("spawn the process with stdin=True to send it input")
        super().close_stdin()


class Files:
    """``sandbox.files``: files and directories in the sandbox, streamed both
    ways (nothing is held whole in memory unless you ask for bytes)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox
        self._c = sandbox._c

    def write(self, path: str, data: bytes | str | IO[bytes] | Iterator[bytes], *, mode: int | str | None = None) -> None:
        """Writes a file (replacing it once complete). ``data``: bytes, text,
        a binary file object or an iterator of chunks (streamed)."""
        self._c._send(core.file_put_call(self._sb.id, path, core.upload_content(data), mode))

    def upload(self, local_path: str | os.PathLike[str], path: str, *, mode: int | str | None = None) -> None:
        """Streams local file ``local_path`` to ``path`` (with its permissions unless ``mode``)."""
        if mode is None:
            mode = os.stat(local_path).st_mode & 0o7777
        self._c._send(core.file_put_call(self._sb.id, path, core.local_chunks(local_path), mode))

    def read(self, path: str) -> bytes:
        """A file's content (a directory comes as a tar)."""
        with self.stream(path) as chunks:
            return b"".join(chunks)

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return self.read(path).decode(encoding)

    @contextlib.contextmanager
    def stream(self, path: str, chunk_size: int = core.CHUNK) -> Iterator[Iterator[bytes]]:
        """``with files.stream(path) as chunks:`` the content as it arrives."""
        resp = self._c._send(core.file_get_call(self._sb.id, path))
        try:
            yield resp.iter_bytes(chunk_size)
        except httpx.TransportError as e:
            raise core.transport_error(self._c.url, e) from e
        finally:
            resp.close()

    def download(self, path: str, local_path: str | os.PathLike[str] | IO[bytes]) -> None:
        """Streams file ``path`` to a local file (or a binary file object)."""
        with self.stream(path) as chunks:
            if hasattr(local_path, "write"):
                for b in chunks:
                    local_path.write(b)
                return
            tmp = Path(f"{os.fspath(local_path)}.part")
            with open(tmp, "wb") as f:
                for b in chunks:
                    f.write(b)
            os.replace(tmp, local_path)

    def stat(self, path: str) -> models.PathEntry:
        """What ``path`` is: kind, size, mode, owner, modification time. A
        final symlink is described, not followed. :class:`~warren.NotFound`
        if nothing is there."""
        return core.one_entry(self._c._call(core.path_call(self._sb.id, "stat", path=path)), "stat")

    def exists(self, path: str) -> bool:
        """Whether anything is at ``path`` (a dangling symlink counts)."""
        try:
            self.stat(path)
            return True
        except errors.NotFound:
            return False

    def list(self, path: str, depth: int = 1) -> builtins.list[models.PathEntry]:
        """The entries of directory ``path``, and of its subdirectories down
        to ``depth`` levels (1: its own). Symlinks are listed, never entered."""
        return self._c._call(core.list_dir_call(self._sb.id, path, depth))

    def mkdir(self, path: str) -> models.PathEntry:
        """Makes directory ``path`` and its missing parents;
        :class:`~warren.Conflict` if ``path`` exists already."""
        return core.one_entry(self._c._call(core.path_call(self._sb.id, "make_dir", path=path)), "mkdir")

    def rename(self, src: str, dst: str) -> models.PathEntry:
        """Moves ``src`` (a file or a whole directory) to ``dst``, making
        ``dst``'s parents; a file at ``dst`` is replaced. Answers ``dst``."""
        return core.one_entry(self._c._call(core.rename_call(self._sb.id, src, dst)), "rename")

    def set_attrs(
        self, path: str, *, uid: int | None = None, gid: int | None = None, mode: int | None = None
    ) -> models.PathEntry:
        """Changes ``path``'s owner (ids as the sandbox sees them), group
        and/or permission bits (``chown``/``chmod``); a final symlink's own
        owner, never its target's."""
        return core.one_entry(self._c._call(core.set_attrs_call(self._sb.id, path, uid, gid, mode)), "set_attrs")

    def remove(self, path: str) -> None:
        """Removes a file, a link (not what it points to) or a directory
        with everything in it; :class:`~warren.NotFound` if nothing is there."""
        self._c._call(core.path_call(self._sb.id, "remove", path=path))

    def upload_dir(self, local_dir: str | os.PathLike[str], path: str) -> None:
        """Copies the contents of local directory ``local_dir`` into ``path``
        (created if missing), as a tar generated while it is sent."""
        self._c._send(core.file_put_call(self._sb.id, path, core.tar_stream(local_dir), tar=True))

    def download_dir(self, path: str, local_dir: str | os.PathLike[str]) -> None:
        """Copies the contents of directory ``path`` into ``local_dir``,
        unpacked while it streams (paths leaving ``local_dir`` are refused)."""
        resp = self._c._send(core.file_get_call(self._sb.id, path))
        try:
            if not core.is_tar(resp):
                raise NotADirectoryError(path)
            core.extract_tar(core.ChunkReader(resp.iter_bytes()), local_dir)
        finally:
            resp.close()


class Network:
    """``sandbox.network``: the egress rules of an ``allowlist`` sandbox."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def set(self, allow: Sequence[str] = (), deny: Sequence[str] = ()) -> models.NetworkChange:
        """Replaces the rules (atomically); connections they no longer allow are closed."""
        change = self._sb._c._call(core.network_call(self._sb.id, allow, deny))
        self._sb.info = change.sandbox
        return change


class Port:
    """A TCP port inside a sandbox (on its loopback).

    ``url`` is the HTTP route to it through the daemon (it needs the API
    token: use :meth:`request`, which sends it). :meth:`connect` opens a raw
    tunnel instead, for any protocol; :meth:`browser_link` is for people,
    in a browser."""

    def __init__(self, sandbox: Sandbox, port: int) -> None:
        self._sb = sandbox
        self.port = int(port)
        self.url = f"{sandbox._c.url}{core.port_path(sandbox.id, self.port)}"

    def request(self, method: str, path: str = "/", **kwargs: Any) -> httpx.Response:
        """An HTTP request to the server on the port (``kwargs`` as for httpx)."""
        c = self._sb._c
        try:
            resp = c._http.request(method, core.port_path(self._sb.id, self.port, path), **kwargs)
        except httpx.TransportError as e:
            raise core.transport_error(c.url, e) from e
        if resp.headers.get("content-type", "").startswith("application/json") and resp.status_code in (400, 404, 409, 503):
            with contextlib.suppress(Exception):
                if "error" in resp.json() and set(resp.json()) == {"error"}:
                    raise core.api_error(resp)
        return resp

    def get(self, path: str = "/", **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str = "/", **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def browser_link(self) -> str:
        """A link to open the server's pages in a browser, on an origin of
        their own (never the API's); it must be opened within minutes."""
        return self._sb._c._call(core.port_link_call(self._sb.id, self.port))

    def connect(self, timeout: float | None = 10.0) -> socket.socket:
        """A connected socket whose bytes reach the port in the sandbox."""
        c = self._sb._c
        ep = core.endpoint(c.url)
        try:
            sock = socket.create_connection((ep.host, ep.port), timeout=timeout)
            if ep.tls:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=ep.host)
            sock.sendall(core.upgrade_request(ep, c._cfg.token, self._sb.id, self.port))
            head = b""
            while b"\r\n\r\n" not in head:
                b = sock.recv(1)  # byte by byte: nothing past the head is consumed
                if not b:
                    raise ConnectionError("the daemon closed the connection")
                head += b
        except OSError as e:
            raise core.transport_error(c.url, e) from e
        status, headers = core.upgrade_head(head)
        if status != 101:
            n = int(headers.get("content-length", "0"))
            body = b""
            while len(body) < n:
                b = sock.recv(n - len(body))
                if not b:
                    break
                body += b
            sock.close()
            raise core.upgrade_error(status, headers, body)
        sock.settimeout(None)
        return sock


class _LineStream:
    def __init__(self, client: Client, call: Call[None]) -> None:
        self._c = client
        self._call = call
        self._lines: Iterator[str] | None = None
        self._resp: httpx.Response | None = None

    def _open(self) -> Iterator[str]:
        if self._lines is None:
            self._resp = self._c._send(self._call)
            self._lines = self._c._lines(self._resp)
        return self._lines

    def close(self) -> None:
        if self._resp is not None:
            self._resp.close()


class LogStream(_LineStream):
    """Log lines as they are read (see :meth:`Sandbox.follow_logs`)."""

    def __iter__(self) -> Iterator[models.LogLine]:
        for line in self._open():
            parsed = core.parse_log_line(line)
            if parsed is not None:
                yield parsed

    def __enter__(self) -> LogStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EventStream:
    """Events as an iterator (see :meth:`Client.events`); ``last_seq`` is the
    sequence number to resume after."""

    def __init__(
        self,
        client: Client,
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

    def __iter__(self) -> Iterator[models.Event]:
        sandbox, labels, batch, type = self._args
        call = core.events_call(sandbox, labels, batch, type, self.last_seq, self._follow)
        if self._follow:
            self._resp = self._c._send(call)
            for line in self._c._lines(self._resp):
                ev = core.parse_event(line)
                if ev is not None:
                    self.last_seq = ev.seq
                    yield ev
            return
        while not self._closed:
            page = self._c._call(call)
            for ev in page:
                self.last_seq = ev.seq
                yield ev
            if not page:
                return
            call = core.events_call(sandbox, labels, batch, type, self.last_seq, False)

    def close(self) -> None:
        self._closed = True
        if self._resp is not None:
            self._resp.close()

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Batches:
    """``client.batches``."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(
        self,
        count: int,
        image: str | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        retry_on_oom: bool = False,
        retry_on_lost: bool = False,
        **spec: Any,
    ) -> Batch:
        """Same as :meth:`Client.batch`."""
        body = core.spec_body(image, spec)
        return Batch(self._c, self._c._call(core.batch_create_call(count, body, labels, retry_on_oom, retry_on_lost)))

    def get(self, batch_id: str) -> Batch:
        return Batch(self._c, self._c._call(core.batch_get_call(batch_id)))

    def list(self) -> list[Batch]:
        return [Batch(self._c, i) for i in self._c._call(core.batch_list_call())]


class Batch:
    """A batch of sandboxes: progress (``info.states``, ``info.failures``),
    :meth:`wait`, its members and :meth:`delete`."""

    def __init__(self, client: Client, info: models.BatchInfo) -> None:
        self._c = client
        self.info = info
        self.id = info.id

    def __repr__(self) -> str:
        return f"<Batch {self.id} {self.info.submitted}/{self.info.count} {self.info.states}>"

    @property
    def counts(self) -> dict[str, int]:
        """Members per state, when ``info`` was last read."""
        return dict(self.info.states)

    def refresh(self) -> models.BatchInfo:
        self.info = self._c._call(core.batch_get_call(self.id))
        return self.info

    def watch(self, until: str | None = None, interval: float = 0.25) -> Iterator[models.BatchInfo]:
        """Yields the batch's info each time it changes, until ``until``
        (``ready``: all members running; ``done``: all finished; default
        ``done`` when the spec has a ``cmd``, else ``ready``)."""
        until = until or ("done" if self.info.spec.cmd else "ready")
        last: Any = None
        while True:
            info = self.refresh()
            key = (info.submitted, sorted(info.states.items()), len(info.failures))
            if key != last:
                last = key
                yield info
            if core.batch_done(info, until):
                return
            time.sleep(interval)

    def wait(
        self,
        until: str | None = None,
        *,
        timeout: float | None = None,
        on_progress: Callable[[models.BatchInfo], None] | None = None,
        interval: float = 0.25,
    ) -> models.BatchInfo:
        """Waits for the batch (see :meth:`watch`), calling ``on_progress``
        with each change; returns the final info."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for info in self.watch(until, interval):
            if on_progress is not None:
                on_progress(info)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"batch {self.id} not {until or 'settled'} after {timeout}s: {info.states}")
        return self.info

    def sandboxes(self, *, state: str | Sequence[str] | None = None, all: bool = False) -> list[Sandbox]:
        """The batch's members (live ones unless ``state``/``all``)."""
        return self._c.sandboxes.list({core.BATCH_LABEL: self.id}, state=state, all=all)

    def events(self, follow: bool = False) -> EventStream:
        return self._c.events(batch=self.id, follow=follow)

    def delete(self) -> models.BatchInfo:
        """Stops submitting and destroys every member."""
        self.info = self._c._call(core.batch_delete_call(self.id))
        return self.info


class Images:
    """``client.images``: the node's image store."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def list(self) -> list[models.Image]:
        return self._c._call(core.images_list_call())

    def pull(self, reference: str, *, on_progress: Callable[[models.PullEvent], None] | None = None) -> models.Image:
        """Pulls ``host[:port]/repo[:tag|@digest]`` (only what the store
        lacks), calling ``on_progress`` with each pull event."""
        if on_progress is None:
            return self._c._call(core.image_pull_call(reference, False))
        resp = self._c._send(core.image_pull_call(reference, True))
        for line in self._c._lines(resp):
            item = core.pull_line(line)
            if isinstance(item, models.Image):
                return item
            if item is not None:
                on_progress(item)
        raise errors.StreamError(f"the pull of {reference} ended without an answer")

    def prewarm(self, reference: str, nodes: Sequence[str] | None = None) -> models.PrewarmResult:
        """Pulls a registry image onto ``nodes`` (all when None) ahead of a batch."""
        return self._c._call(core.image_prewarm_call(reference, nodes))

    def import_(self, name: str, archive: str | os.PathLike[str] | IO[bytes]) -> models.Image:
        """Imports an OCI image-layout or docker-archive tar (streamed) as ``name``."""
        content = core.local_chunks(archive) if isinstance(archive, (str, os.PathLike)) else core.read_chunks(archive)
        return self._c._call(core.image_import_call(name, content))

    def build(
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
        """Builds an image from the directory ``context`` and its
        ``dockerfile`` (``warren build``): each RUN in a sandbox of the step
        before, each step kept in the step cache. ``allow`` lists the
        ``HOST:PORT`` RUN steps may reach; ``test`` runs in a fresh sandbox
        of the result before ``tag`` moves. Raises :class:`BuildFailed`."""
        call = core.build_call(context, tag, dockerfile, build_args, target, allow, test, push, no_cache)
        tracker = core.BuildTracker()
        resp = self._c._send(call)
        for line in self._c._lines(resp):
            ev = tracker.line(line)
            if ev is not None and on_event is not None:
                on_event(ev)
        return tracker.result()

    def push(self, reference: str, source: str | None = None) -> models.PushResult:
        return self._c._call(core.image_push_call(reference, source))

    def delete(self, reference: str) -> models.Image:
        return self._c._call(core.image_delete_call(reference))

    def gc(self, budget: int | str | None = None) -> models.GcReport:
        return self._c._call(core.image_gc_call(budget))


class Profiles:
    """``client.profiles``: learned resource profiles."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def list(self) -> list[models.Profile]:
        return self._c._call(core.profiles_list_call())

    def get(self, name: str) -> models.ProfileDetail:
        """A profile with its recommendation and recent runs."""
        return self._c._call(core.profile_get_call(name))

    def reset(self, name: str) -> models.Profile:
        return self._c._call(core.profile_reset_call(name))

    def export(self) -> str:
        """The profile table as TOML."""
        return self._c._call(core.profiles_export_call())

    def import_(self, toml: str | bytes | os.PathLike[str]) -> builtins.list[models.Profile]:
        """Loads a TOML profile table (text, bytes or a path); listed profiles are replaced."""
        return self._c._call(core.profiles_import_call(toml))


class Volumes:
    """``client.volumes``: named storage of a fixed size on a node, kept
    across sandboxes; mount one with ``volumes=["NAME:/PATH[:ro]"]``."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self, name: str, size: str | int, *, node_selector: Mapping[str, str] | None = None) -> models.Volume:
        """Makes a volume of ``size`` (bytes or ``"20G"``); raises
        :class:`Conflict` if the name is taken."""
        return self._c._call(core.volume_create_call(name, size, node_selector))

    def list(self) -> builtins.list[models.Volume]:
        return self._c._call(core.volumes_list_call())

    def remove(self, name: str) -> models.Volume:
        """Removes a volume and its files; raises :class:`Conflict` while a
        sandbox mounts it."""
        return self._c._call(core.volume_delete_call(name))


class Secrets:
    """``client.secrets``: values kept sealed by the server, given to the
    sandboxes that name them (``secrets=["NAME,env=VAR"]``). No call
    returns a value."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self, name: str, value: str, *, metadata: Mapping[str, str] | None = None) -> models.Secret:
        """Keeps a secret (version 1); raises :class:`Conflict` if the name is taken."""
        return self._c._call(core.secret_put_call(name, value, metadata, create=True))

    def set(self, name: str, value: str, *, metadata: Mapping[str, str] | None = None) -> models.Secret:
        """A new value (and metadata, when given): sandboxes made from now on get it."""
        return self._c._call(core.secret_put_call(name, value, metadata, create=False))

    def get(self, name: str) -> models.Secret:
        return self._c._call(core.secret_get_call(name))

    def list(self) -> builtins.list[models.Secret]:
        return self._c._call(core.secrets_list_call())

    def remove(self, name: str) -> models.Secret:
        """Removes a secret; sandboxes given it keep their copies."""
        return self._c._call(core.secret_delete_call(name))


class Tenants:
    """``client.tenants``: who shares the cluster, each with a quota, a
    weight of its share and a priority (docs/tenants.md). Making and
    changing them takes the operator's token; a tenant's token reads its
    own."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(
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
        """Makes a tenant (give it a token with :meth:`Tokens.create`);
        raises :class:`Conflict` if the name is taken."""
        spec = core.tenant_spec(cpu, memory, gpus, sandboxes, weight, priority, preempt, egress)
        return self._c._call(core.tenant_create_call(name, spec))

    def set(
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
        """Replaces a tenant's quota and share (what is not given is unbounded or default)."""
        spec = core.tenant_spec(cpu, memory, gpus, sandboxes, weight, priority, preempt, egress)
        return self._c._call(core.tenant_set_call(name, spec))

    def get(self, name: str) -> models.Tenant:
        return self._c._call(core.tenant_get_call(name))

    def list(self) -> builtins.list[models.Tenant]:
        return self._c._call(core.tenants_list_call())

    def remove(self, name: str) -> None:
        """Removes a tenant that owns nothing live, and its tokens."""
        self._c._call(core.tenant_delete_call(name))


class Tokens:
    """``client.tokens``: tenants' API tokens (stored hashed; a value is
    shown once, when made)."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def create(self, tenant: str, role: str = "user", description: str = "") -> models.NewToken:
        """A new token of ``tenant`` with ``role`` (``admin``, ``user`` or
        ``viewer``); its value is ``.token``, shown this once."""
        return self._c._call(core.token_create_call(tenant, role, description))

    def list(self) -> builtins.list[models.Token]:
        return self._c._call(core.tokens_list_call())

    def revoke(self, token_id: str) -> models.Token:
        """Revokes a token at once: its next call is refused."""
        return self._c._call(core.token_revoke_call(token_id))
