"""The SDK's sans-IO core: everything both clients share and nothing that
does I/O. Each API call is described once here as a :class:`Call` (method,
path, body, how to read the answer, whether a retry is safe); the sync and
async clients only send Calls and feed answers back. Exec-stream decoding,
the retry policy, the lease keeper's schedule, tar streaming and the port
tunnel's handshake live here too, so the two clients cannot drift apart."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import io
import json
import math
import os
import random
import re
import stat
import tarfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar, Union

import httpx

from . import errors, models
from .models import from_json

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:7070"
DEFAULT_HOME = "/var/lib/warren"
USER_AGENT = "warren-python/0.1.0"
BATCH_LABEL = "warren.dev/batch"

Seconds = Union[int, float, str, datetime.timedelta]
"""A duration: seconds (``30``, ``2.5``), text (``"30s"``, ``"10m"``,
``"1h30m"``) or a ``timedelta``."""
Labels = Union[Mapping[str, str], str, Sequence[str]]
"""A label selector: ``{"task": "swe"}`` (every pair must match), the
API's text form (``"task=swe,code in (v1,v2)"``) or a list of such terms."""
Cmd = Union[str, Sequence[str]]
"""A command: an argv list, or a string run by ``sh -c``."""


# ---------------------------------------------------------------- configuration


@dataclass(frozen=True)
class Config:
    url: str
    token: str

    @staticmethod
    def resolve(url: str | None, token: str | None, home: str | os.PathLike[str] | None) -> Config:
        """Arguments first, then ``WARREN_URL`` / ``WARREN_TOKEN`` /
        ``<WARREN_HOME or /var/lib/warren>/token``, as the CLI does."""
        url = url or os.environ.get("WARREN_URL") or DEFAULT_URL
        token = token or os.environ.get("WARREN_TOKEN")
        if not token:
            home_dir = Path(home or os.environ.get("WARREN_HOME") or DEFAULT_HOME)
            path = home_dir / "token"
            try:
                token = path.read_text().strip()
            except OSError as e:
                raise errors.WarrenError(
                    f"no API token: pass token=, set WARREN_TOKEN or make {path} readable "
                    f"(is `warren up --home {home_dir}` running?): {e}"
                ) from None
        # A token travels in a header: anything but printable ASCII (a
        # placeholder copied from a doc, a stray newline) would fail deep in
        # httpx with an encoding error instead of saying what is wrong.
        if not all(" " < c < "\x7f" for c in token):
            raise errors.WarrenError(
                "the API token must be printable ASCII without spaces (the one `warren up` wrote to <home>/token)"
            )
        return Config(url=url.rstrip("/"), token=token)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", "User-Agent": USER_AGENT}


def default_limits() -> httpx.Limits:
    # Exec and event streams hold a connection each while they run; a
    # rollout keeps hundreds open at once. Waiting for a free connection is
    # back-pressure, not an error (the pool timeout is off). An idle
    # connection is dropped after 10 s, well before the daemon closes it
    # (30 s): reusing one just as the daemon closes it fails the request
    # with nothing read back, and a create or exec cannot be retried blindly.
    return httpx.Limits(max_connections=1024, max_keepalive_connections=256, keepalive_expiry=10)


def default_timeout(timeout: float | httpx.Timeout | None) -> httpx.Timeout:
    if isinstance(timeout, httpx.Timeout):
        return timeout
    return httpx.Timeout(timeout, connect=10.0, pool=None)


# ---------------------------------------------------------------- calls


def _none(_: httpx.Response) -> None:
    return None


@dataclass
class Call(Generic[T]):
    """One API request and how to read its answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: dict[str, str] | list[tuple[str, str | int | float | bool | None]] | None = None
    json: Any = None
    content: Any = None
    headers: dict[str, str] | None = None
    idempotent: bool = False
    """Safe to send again after a 429/503 or a broken connection."""
    sandbox: str | None = None
    """The sandbox this call touches (any call renews its lease)."""
    no_read_timeout: bool = False
    stream: bool = False

    def replayable(self) -> bool:
        return self.content is None or isinstance(self.content, (bytes, str))

    def request(self, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        ext: dict[str, Any] = {}
        if self.no_read_timeout:
            t = http.timeout
            ext["timeout"] = httpx.Timeout(connect=t.connect, read=None, write=t.write, pool=t.pool).as_dict()
        return http.build_request(
            self.method,
            self.path,
            params=self.params,
            json=self.json,
            content=self.content,
            headers=self.headers,
            extensions=ext or None,
        )


def json_of(model: type[T]) -> Callable[[httpx.Response], T]:
    return lambda r: from_json(model, r.json())


def json_list(model: type[T]) -> Callable[[httpx.Response], list[T]]:
    return lambda r: [from_json(model, x) for x in r.json()]


# ---------------------------------------------------------------- errors and retries


def retry_after_of(resp: httpx.Response) -> float | None:
    v = resp.headers.get("retry-after")
    if v is None:
        return None
    try:
        return max(float(v), 0.0)
    except ValueError:
        return None


def api_error(resp: httpx.Response) -> errors.APIError:
    """The exception for an error answer (its body must have been read)."""
    code: str | None = None
    message = resp.text.strip() or resp.reason_phrase
    retry_after = retry_after_of(resp)
    try:
        body = json.loads(resp.content)
        detail = body["error"]
        code = str(detail["code"])
        message = str(detail["message"])
        if retry_after is None and detail.get("retry_after_ms") is not None:
            retry_after = float(detail["retry_after_ms"]) / 1000
    except (ValueError, KeyError, TypeError):
        pass
    return errors.error_for(resp.status_code, code, message, retry_after)


@dataclass
class RetryPolicy:
    """When to try a call again: only where it is safe (an idempotent call,
    a create with a request id, or a connection that never opened), on 429
    and 503, waiting what ``Retry-After`` says (else exponential backoff with
    jitter)."""

    max_retries: int = 5
    backoff: float = 0.2
    max_backoff: float = 10.0

    def _delay(self, attempt: int, hint: float | None) -> float:
        if hint is not None:
            return min(hint, self.max_backoff)
        d = min(self.backoff * 2.0**attempt, self.max_backoff)
        return d * (0.5 + random.random() / 2)

    def after_status(self, call: Call[Any], attempt: int, resp: httpx.Response) -> float | None:
        if attempt >= self.max_retries or resp.status_code not in (429, 503):
            return None
        if not (call.idempotent and call.replayable()):
            return None
        return self._delay(attempt, retry_after_of(resp))

    def after_error(self, call: Call[Any], attempt: int, exc: Exception) -> float | None:
        if attempt >= self.max_retries or not call.replayable():
            return None
        # A connection that never opened sent nothing: safe for any call.
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
            return self._delay(attempt, None)
        if call.idempotent and isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
            return self._delay(attempt, None)
        return None


def transport_error(base: str, exc: Exception) -> errors.TransportError:
    return errors.TransportError(f"cannot reach Warren at {base}: {exc!r}")


# ---------------------------------------------------------------- values


def seconds(value: Seconds) -> float:
    """A duration in seconds."""
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, (int, float)):
        return float(value)
    return parse_duration(value)


_DUR = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """``"30s"``, ``"10m"``, ``"1h30m"``, ``"250ms"`` or a number of seconds."""
    s = text.strip()
    try:
        return float(s)
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _DUR.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 10m, 1h30m)")
    return total


def duration_value(value: Seconds) -> float | int | str:
    """A duration as the API takes it."""
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return value


def ago_text(value: Seconds) -> str:
    """A time ago as the API's windows take it (``30s``, ``10m``, ``1h``):
    a text as it is, seconds whole and rounded up, so a window is never
    shorter than asked."""
    ago = duration_value(value)
    return ago if isinstance(ago, str) else f"{math.ceil(ago)}s"


def selector(labels: Labels | None) -> str | None:
    if labels is None:
        return None
    if isinstance(labels, str):
        return labels
    if isinstance(labels, Mapping):
        return ",".join(f"{k}={v}" for k, v in labels.items())
    return ",".join(labels)


def argv(cmd: Cmd) -> list[str]:
    if isinstance(cmd, str):
        return ["sh", "-c", cmd]
    out = [str(c) for c in cmd]
    if not out:
        raise ValueError("cmd is empty")
    return out


def b64(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode()


# `fork` is set by a fork on its children, never by a create.
_SPEC_FIELDS = {f.name for f in dataclasses.fields(models.SandboxSpec)} - {"fork"}
_DURATIONS = {"ttl", "lease", "keep_for"}


def spec_body(image: str | None, spec: Mapping[str, Any]) -> dict[str, Any]:
    """A ``SandboxSpec`` body from keyword arguments. Besides the spec's own
    fields, ``allow=[…]``/``deny=[…]`` make an ``allowlist`` network (or
    add rules to an ``open`` one), ``cmd``
    may be a string (run by ``sh -c``) and durations may be seconds or
    ``timedelta``."""
    body: dict[str, Any] = {}
    if image is not None:
        body["image"] = image
    allow = spec.get("allow")
    deny = spec.get("deny")
    for key, value in spec.items():
        if key in ("allow", "deny") or value is None:
            continue
        if key not in _SPEC_FIELDS:
            raise TypeError(f"unknown sandbox spec field {key!r} (known: {', '.join(sorted(_SPEC_FIELDS | {'allow', 'deny'}))})")
        if key in _DURATIONS:
            value = duration_value(value)
        elif key == "cmd":
            value = argv(value)
        elif key == "network" and isinstance(value, models.NetworkSpec):
            value = dataclasses.asdict(value)
        elif key in ("env", "labels"):
            value = {str(k): str(v) for k, v in value.items()}
        elif key == "volumes":
            value = [volume_mount(v) for v in value]
        elif key == "secrets":
            value = [secret_ref(v) for v in value]
        body[key] = value
    if allow is not None or deny is not None:
        net = dict(body.get("network") or {})
        if net.get("mode") != "open":
            net["mode"] = "allowlist"
        net["allow"] = list(allow or net.get("allow") or [])
        net["deny"] = list(deny or net.get("deny") or [])
        body["network"] = net
    if "image" not in body:
        raise TypeError("a sandbox needs an image")
    return body


def volume_mount(v: models.VolumeMount | Mapping[str, Any] | str) -> dict[str, Any]:
    """A volume mount as the API takes it, from a :class:`VolumeMount`, a
    mapping, or ``"NAME:/PATH[:ro]"`` as ``docker run -v`` writes it."""
    if isinstance(v, models.VolumeMount):
        return dataclasses.asdict(v)
    if isinstance(v, str):
        parts = v.split(":")
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
            raise TypeError(f"volume {v!r}: write NAME:/PATH or NAME:/PATH:ro")
        return {"name": parts[0], "path": parts[1], "read_only": len(parts) == 3 and parts[2] == "ro"}
    return dict(v)


def secret_ref(v: models.SecretRef | Mapping[str, Any] | str) -> dict[str, Any]:
    """A secret as the API takes it, from a :class:`SecretRef`, a mapping, or
    ``"NAME[,env=VAR|,target=FILE]"`` as ``warren create --secret`` writes it."""
    if isinstance(v, models.SecretRef):
        return {k: x for k, x in dataclasses.asdict(v).items() if x is not None}
    if isinstance(v, str):
        name, *opts = v.split(",")
        out: dict[str, Any] = {"name": name}
        for opt in opts:
            key, eq, val = opt.partition("=")
            if not eq or key not in ("env", "target") or key in out:
                raise TypeError(f"secret {v!r}: write NAME, NAME,env=VAR or NAME,target=FILE")
            out[key] = val
        return out
    return dict(v)


def secrets_list_call() -> Call[list[models.Secret]]:
    return Call("GET", "/v1/secrets", json_list(models.Secret), idempotent=True)


def secret_get_call(name: str) -> Call[models.Secret]:
    return Call("GET", f"/v1/secrets/{name}", json_of(models.Secret), idempotent=True)


def secret_put_call(name: str, value: str, metadata: Mapping[str, str] | None, create: bool) -> Call[models.Secret]:
    body: dict[str, Any] = {"value": value}
    if metadata is not None:
        body["metadata"] = dict(metadata)
    if create:
        return Call("POST", "/v1/secrets", json_of(models.Secret), json={"name": name, **body})
    return Call("PUT", f"/v1/secrets/{name}", json_of(models.Secret), json=body)


def secret_delete_call(name: str) -> Call[models.Secret]:
    return Call("DELETE", f"/v1/secrets/{name}", json_of(models.Secret), idempotent=True)


# ---------------------------------------------------------------- tenants


def whoami_call() -> Call[models.WhoAmI]:
    return Call("GET", "/v1/whoami", json_of(models.WhoAmI), idempotent=True)


def tenant_spec(
    cpu: float | str | None,
    memory: int | str | None,
    gpus: int | None,
    sandboxes: int | None,
    weight: int,
    priority: int,
    preempt: bool,
    egress: Sequence[str] | None,
) -> dict[str, Any]:
    """A tenant's quota and share as the API takes them (quantities as the
    CLI writes them: ``cpu=4`` or ``"500m"``, ``memory="64G"``)."""
    quota = {k: v for k, v in {"cpu": cpu, "memory": memory, "gpus": gpus, "sandboxes": sandboxes}.items() if v is not None}
    spec: dict[str, Any] = {"quota": quota, "weight": weight, "priority": priority, "preempt": preempt}
    if egress is not None:
        spec["egress"] = list(egress)
    return spec


def tenants_list_call() -> Call[list[models.Tenant]]:
    return Call("GET", "/v1/tenants", json_list(models.Tenant), idempotent=True)


def tenant_get_call(name: str) -> Call[models.Tenant]:
    return Call("GET", f"/v1/tenants/{name}", json_of(models.Tenant), idempotent=True)


def tenant_create_call(name: str, spec: dict[str, Any]) -> Call[models.Tenant]:
    return Call("POST", "/v1/tenants", json_of(models.Tenant), json={"name": name, **spec})


def tenant_set_call(name: str, spec: dict[str, Any]) -> Call[models.Tenant]:
    return Call("PUT", f"/v1/tenants/{name}", json_of(models.Tenant), json=spec, idempotent=True)


def tenant_delete_call(name: str) -> Call[None]:
    return Call("DELETE", f"/v1/tenants/{name}", _none, idempotent=True)


def tokens_list_call() -> Call[list[models.Token]]:
    return Call("GET", "/v1/tokens", json_list(models.Token), idempotent=True)


def token_create_call(tenant: str, role: str, description: str) -> Call[models.NewToken]:
    body = {"tenant": tenant, "role": role, "description": description}
    return Call("POST", "/v1/tokens", json_of(models.NewToken), json=body)


def token_revoke_call(token_id: str) -> Call[models.Token]:
    return Call("DELETE", f"/v1/tokens/{token_id}", json_of(models.Token), idempotent=True)


def audit_call(tenant: str | None, since: Seconds | None, until: Seconds | None, limit: int | None) -> Call[list[models.AuditEntry]]:
    params: dict[str, str] = {}
    if tenant is not None:
        params["tenant"] = tenant
    for key, value in (("since", since), ("until", until)):
        if value is not None:
            params[key] = ago_text(value)
    if limit is not None:
        params["limit"] = str(limit)
    return Call("GET", "/v1/audit", json_list(models.AuditEntry), params=params, idempotent=True)


def volumes_list_call() -> Call[list[models.Volume]]:
    return Call("GET", "/v1/volumes", json_list(models.Volume), idempotent=True)


def volume_create_call(name: str, size: str | int, node_selector: Mapping[str, str] | None) -> Call[models.Volume]:
    body: dict[str, Any] = {"name": name, "size": size}
    if node_selector:
        body["node_selector"] = dict(node_selector)
    return Call("POST", "/v1/volumes", json_of(models.Volume), json=body)


def volume_delete_call(name: str) -> Call[models.Volume]:
    return Call("DELETE", f"/v1/volumes/{name}", json_of(models.Volume), idempotent=True)


def new_request_id() -> str:
    return f"py-{uuid.uuid4().hex}"


def lease_seconds(info: models.SandboxInfo) -> float | None:
    lease = info.spec.lease
    if lease is None:
        return None
    return seconds(lease)


# ---------------------------------------------------------------- sandbox calls


def sb_path(sid: str, tail: str = "") -> str:
    return f"/v1/sandboxes/{sid}{tail}"


def create_call(body: dict[str, Any], wait: bool = True) -> Call[models.SandboxInfo]:
    body.setdefault("request_id", new_request_id())
    return Call(
        "POST",
        "/v1/sandboxes",
        json_of(models.SandboxInfo),
        params=None if wait else {"wait": "false"},
        json=body,
        idempotent=True,  # the request id makes a repeat return the same sandbox
        no_read_timeout=True,  # it waits in the node's queue for capacity
    )


def get_call(sid: str) -> Call[models.SandboxInfo]:
    return Call("GET", sb_path(sid), json_of(models.SandboxInfo), idempotent=True, sandbox=sid)


def delete_call(sid: str) -> Call[models.SandboxInfo]:
    return Call("DELETE", sb_path(sid), json_of(models.SandboxInfo), idempotent=True)


def list_call(labels: Labels | None, state: str | Sequence[str] | None, all: bool) -> Call[list[models.SandboxInfo]]:
    params: dict[str, str] = {}
    sel = selector(labels)
    if sel:
        params["label"] = sel
    if state:
        params["state"] = state if isinstance(state, str) else ",".join(state)
    if all:
        params["all"] = "true"
    return Call("GET", "/v1/sandboxes", json_list(models.SandboxInfo), params=params, idempotent=True)


def delete_many_call(labels: Labels) -> Call[list[models.SandboxInfo]]:
    sel = selector(labels)
    if not sel:
        raise ValueError("deleting by label needs a non-empty selector")
    return Call("DELETE", "/v1/sandboxes", json_list(models.SandboxInfo), params={"label": sel}, idempotent=True)


def action_call(sid: str, action: str, body: Any = None, idempotent: bool = True) -> Call[models.SandboxInfo]:
    return Call(
        "POST", sb_path(sid, f"/{action}"), json_of(models.SandboxInfo), json=body, idempotent=idempotent, sandbox=sid
    )


def ttl_call(sid: str, ttl: Seconds) -> Call[models.SandboxInfo]:
    return action_call(sid, "ttl", {"ttl": duration_value(ttl)})


def reclaim_call(sid: str, reclaim: str, keep_for: Seconds | None) -> Call[models.SandboxInfo]:
    body: dict[str, Any] = {"reclaim": reclaim}
    if keep_for is not None:
        body["keep_for"] = duration_value(keep_for)
    return action_call(sid, "reclaim", body)


def network_call(sid: str, allow: Sequence[str], deny: Sequence[str]) -> Call[models.NetworkChange]:
    return Call(
        "PATCH",
        sb_path(sid, "/network"),
        json_of(models.NetworkChange),
        json={"allow": list(allow), "deny": list(deny)},
        idempotent=True,
        sandbox=sid,
    )


_FORK_FIELDS = {"cpu", "memory", "cpu_request", "memory_request", "pids", "disk", "ttl", "lease", "with_processes"}


def fork_call(
    sid: str, count: int, labels: Mapping[str, str] | None, overrides: Mapping[str, Any]
) -> Call[list[models.SandboxInfo]]:
    """``POST /v1/sandboxes/{id}/fork``. Not retried: a repeat would fork again."""
    body: dict[str, Any] = {"count": count}
    if labels:
        body["labels"] = {str(k): str(v) for k, v in labels.items()}
    for key, value in overrides.items():
        if value is None:
            continue
        if key not in _FORK_FIELDS:
            raise TypeError(f"a fork cannot change {key!r} (it may change: {', '.join(sorted(_FORK_FIELDS))})")
        body[key] = duration_value(value) if key in ("ttl", "lease") else value
    return Call(
        "POST", sb_path(sid, "/fork"), json_list(models.SandboxInfo), json=body, sandbox=sid, no_read_timeout=True
    )


def commit_call(sid: str, name: str) -> Call[models.Image]:
    return Call("POST", sb_path(sid, "/commit"), json_of(models.Image), json={"name": name}, sandbox=sid, no_read_timeout=True)


def run_call(
    image: str | None, cmd: Cmd, stdin: bytes | str | None, timeout: Seconds | None, spec: Mapping[str, Any]
) -> Call[None]:
    """``POST /v1/run``: one command in a sandbox made for it and removed after
    it. Not retried: a repeat would run the command again."""
    body: dict[str, Any] = {"spec": spec_body(image, {**spec, "cmd": cmd})}
    if stdin is not None:
        body["stdin"] = b64(stdin)
    if timeout is not None:
        body["timeout"] = duration_value(timeout)
    return Call("POST", "/v1/run", _none, json=body, stream=True, no_read_timeout=True)


def feed_run_line(collector: "ExecCollector", line: str) -> None:
    """One NDJSON line of a run stream: the sandbox's state lines are
    skipped (the last says it is destroyed), exec events collected."""
    if not line.strip() or '"sandbox"' in line[:12]:
        return
    ev = parse_exec_line(line)
    if ev is not None:
        collector.feed(ev)


def exec_call(
    sid: str,
    cmd: Cmd,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout: Seconds | None = None,
    stdin: bytes | str | None = None,
    user: str | None = None,
    stdin_open: bool = False,
    tty: bool = False,
    rows: int | None = None,
    cols: int | None = None,
) -> Call[None]:
    body: dict[str, Any] = {"cmd": argv(cmd)}
    if stdin_open:
        body["stdin_open"] = True
    if tty:
        body["tty"] = True
    if rows is not None:
        body["rows"] = rows
    if cols is not None:
        body["cols"] = cols
    if env:
        body["env"] = {str(k): str(v) for k, v in env.items()}
    if cwd is not None:
        body["cwd"] = cwd
    if timeout is not None:
        body["timeout"] = duration_value(timeout)
    if stdin is not None:
        body["stdin"] = b64(stdin)
    if user is not None:
        body["user"] = str(user)
    return Call("POST", sb_path(sid, "/exec"), _none, json=body, sandbox=sid, stream=True)


def exec_stdin_call(sid: str, exec_id: str, data: bytes | str, close: bool) -> Call[None]:
    """More stdin for a running exec started with ``stdin_open`` (not
    replayed: a repeated write would repeat the input)."""
    body = data.encode() if isinstance(data, str) else bytes(data)
    params = {"close": "true"} if close else None
    return Call("POST", sb_path(sid, f"/execs/{exec_id}/stdin"), _none, content=body,
                params=params, sandbox=sid)


def exec_resize_call(sid: str, exec_id: str, rows: int, cols: int) -> Call[None]:
    """The window size of a running exec's terminal (idempotent: the same
    size twice is one size)."""
    return Call("POST", sb_path(sid, f"/execs/{exec_id}/resize"), _none,
                json={"rows": rows, "cols": cols}, idempotent=True, sandbox=sid)


def logs_call(sid: str, follow: bool) -> Call[None]:
    return Call(
        "GET",
        sb_path(sid, "/logs"),
        _none,
        params={"follow": "true"} if follow else None,
        idempotent=True,
        sandbox=sid,
        stream=True,
        no_read_timeout=follow,
    )


def logs_by_label_call(labels: Labels, since: Seconds | None = None) -> Call[None]:
    sel = selector(labels)
    if not sel:
        raise ValueError("logs by label need a non-empty selector")
    params = {"label": sel}
    if since is not None:
        params["since"] = ago_text(since)
    return Call("GET", "/v1/logs", _none, params=params, idempotent=True, stream=True)


def usage_history_call(sid: str) -> Call[list[models.UsageSample]]:
    return Call("GET", sb_path(sid, "/logs"), _usage_samples, params={"usage": "true"}, idempotent=True, sandbox=sid)


def _usage_samples(r: httpx.Response) -> list[models.UsageSample]:
    return [from_json(models.UsageSample, json.loads(line)) for line in r.text.splitlines() if line.strip()]


def parse_log_line(line: str) -> models.LogLine | None:
    if not line.strip():
        return None
    return from_json(models.LogLine, json.loads(line))


# ---------------------------------------------------------------- files


def file_put_call(sid: str, path: str, content: Any, mode: int | str | None = None, tar: bool = False) -> Call[None]:
    params = {"path": path}
    if mode is not None:
        params["mode"] = mode if isinstance(mode, str) else format(mode, "o")
    headers = {"Content-Type": "application/x-tar" if tar else "application/octet-stream"}
    return Call(
        "PUT",
        sb_path(sid, "/files"),
        _none,
        params=params,
        content=content,
        headers=headers,
        idempotent=isinstance(content, (bytes, str)),
        sandbox=sid,
        no_read_timeout=True,
    )


def file_get_call(sid: str, path: str) -> Call[None]:
    return Call("GET", sb_path(sid, "/files"), _none, params={"path": path}, idempotent=True, sandbox=sid, stream=True)


def path_call(sid: str, op: str, **args: Any) -> Call[list[models.PathEntry]]:
    """``POST /v1/sandboxes/{id}/paths``: ``op`` (``stat``, ``list``,
    ``make_dir``, ``rename``, ``remove``) with its arguments; answers the
    entries it found or made."""
    return Call(
        "POST",
        sb_path(sid, "/paths"),
        json_list(models.PathEntry),
        json={"op": op, **args},
        # Only looks are sent again: a repeated make_dir, rename or remove
        # that had happened already would fail for its own effect (409,
        # 404), or a rename move what has since taken the source's place.
        idempotent=op in ("stat", "list"),
        sandbox=sid,
    )


def list_dir_call(sid: str, path: str, depth: int) -> Call[list[models.PathEntry]]:
    if depth < 1:
        raise ValueError(f"depth must be 1 or more (1: the directory's own entries), not {depth}")
    return path_call(sid, "list", path=path, depth=int(depth))


def rename_call(sid: str, src: str, dst: str) -> Call[list[models.PathEntry]]:
    return path_call(sid, "rename", **{"from": src, "to": dst})


def set_attrs_call(
    sid: str, path: str, uid: int | None, gid: int | None, mode: int | None
) -> Call[list[models.PathEntry]]:
    attrs = {k: v for k, v in (("uid", uid), ("gid", gid), ("mode", mode)) if v is not None}
    if not attrs:
        raise ValueError("set_attrs needs uid, gid or mode")
    return path_call(sid, "set_attrs", path=path, **attrs)


def one_entry(entries: list[models.PathEntry], what: str) -> models.PathEntry:
    """The entry a stat, make_dir or rename answers (always exactly one)."""
    if len(entries) != 1:
        raise errors.WarrenError(f"{what}: the daemon answered {len(entries)} entries instead of one")
    return entries[0]


def is_tar(resp: httpx.Response) -> bool:
    return str(resp.headers.get("content-type", "")).startswith("application/x-tar")


CHUNK = 1 << 20


def read_chunks(f: io.BufferedIOBase | Any, size: int = CHUNK) -> Iterator[bytes]:
    while True:
        b = f.read(size)
        if not b:
            return
        yield b


def local_chunks(path: str | os.PathLike[str]) -> Iterator[bytes]:
    with open(path, "rb") as f:
        yield from read_chunks(f)


def upload_content(data: Any) -> Any:
    """Bytes, text, a binary file object or an iterable of byte chunks, as
    an httpx body that streams (never read whole)."""
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if hasattr(data, "read"):
        return read_chunks(data)
    return data


_PAD = b"\0" * 512


def tar_stream(root: str | os.PathLike[str], chunk: int = CHUNK) -> Iterator[bytes]:
    """A tar of the *contents* of local directory ``root``, generated as it
    is sent: headers, then each file in chunks, never a whole file in memory.
    Regular files, directories and symlinks; anything else is skipped."""
    base = Path(root)
    if not base.is_dir():
        raise NotADirectoryError(str(base))
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        dirnames.sort()
        rel_dir = Path(dirpath).relative_to(base)
        entries = sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        for d in dirnames:
            p = Path(dirpath, d)
            if p.is_symlink():
                continue
            st = p.lstat()
            ti = tarfile.TarInfo(str(rel_dir / d))
            ti.type = tarfile.DIRTYPE
            ti.mode = stat.S_IMODE(st.st_mode)
            ti.mtime = int(st.st_mtime)
            yield ti.tobuf(tarfile.PAX_FORMAT)
        for name in entries:
            p = Path(dirpath, name)
            st = p.lstat()
            ti = tarfile.TarInfo(str(rel_dir / name))
            ti.mode = stat.S_IMODE(st.st_mode)
            ti.mtime = int(st.st_mtime)
            if stat.S_ISLNK(st.st_mode):
                ti.type = tarfile.SYMTYPE
                ti.linkname = os.readlink(p)
                yield ti.tobuf(tarfile.PAX_FORMAT)
            elif stat.S_ISREG(st.st_mode):
                ti.size = st.st_size
                yield ti.tobuf(tarfile.PAX_FORMAT)
                left = st.st_size
                with open(p, "rb") as f:
                    while left > 0:
                        b = f.read(min(chunk, left))
                        if not b:  # shrank while we read: keep the promised size
                            b = b"\0" * min(chunk, left)
                        left -= len(b)
                        yield b
                if st.st_size % 512:
                    yield _PAD[: 512 - st.st_size % 512]
    yield _PAD * 2


class ChunkReader(io.RawIOBase):
    """A read-only file over an iterator of byte chunks (for ``tarfile``'s
    streaming mode)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def extract_tar(fileobj: io.RawIOBase | io.BufferedIOBase | Any, dest: str | os.PathLike[str]) -> None:
    """Unpacks a tar stream into ``dest`` (refusing absolute paths, ``..``
    and links out of ``dest``: the sandbox's files are untrusted)."""
    Path(dest).mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=fileobj, mode="r|") as t:
        if hasattr(tarfile, "data_filter"):
            t.extractall(dest, filter="data")
        else:  # pragma: no cover - Python without PEP 706
            root = os.path.realpath(dest)
            for m in t:
                target = os.path.realpath(os.path.join(root, m.name))
                if not (target == root or target.startswith(root + os.sep)) or m.issym() or m.islnk() or m.isdev():
                    continue
                t.extract(m, root)


def kill_cmd(pid: int) -> list[str]:
    """Kills an exec's process group (each exec leads its own). Closing an
    exec stream kills the exec's whole tree too; killing it explicitly
    keeps the stream open, so it still reports the exit."""
    return ["sh", "-c", 'kill -9 -- "-$1" 2>/dev/null; kill -9 "$1" 2>/dev/null; true', "sh", str(int(pid))]


# ---------------------------------------------------------------- exec streams


def parse_exec_line(line: str) -> models.ExecStart | models.ExecOutput | models.ExecExit | None:
    """One NDJSON line of an exec stream as an event (keepalives: None)."""
    if not line.strip():
        return None
    ev = json.loads(line)
    kind = ev.get("type")
    if kind in ("stdout", "stderr"):
        return models.ExecOutput(stream=kind, data=base64.b64decode(ev["data"]))
    if kind == "start":
        return models.ExecStart(exec_id=ev["exec_id"], pid=int(ev["pid"]))
    if kind == "exit":
        return models.ExecExit(
            code=int(ev["code"]),
            duration_ms=int(ev.get("duration_ms", 0)),
            timed_out=bool(ev.get("timed_out", False)),
            signal=ev.get("signal"),
        )
    if kind == "error":
        raise errors.StreamError(f"exec failed: {ev.get('message', '')}")
    return None


@dataclass
class ExecCollector:
    """Accumulates an exec stream's events into an :class:`ExecResult`."""

    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    start: models.ExecStart | None = None
    exit: models.ExecExit | None = None

    def feed(self, ev: models.ExecStart | models.ExecOutput | models.ExecExit) -> None:
        if isinstance(ev, models.ExecOutput):
            (self.stdout if ev.stream == "stdout" else self.stderr).extend(ev.data)
        elif isinstance(ev, models.ExecStart):
            self.start = ev
        else:
            self.exit = ev

    def result(self) -> models.ExecResult:
        if self.exit is None:
            raise errors.StreamError(
                "the exec stream ended without an exit event (was the sandbox destroyed or the daemon stopped?)"
            )
        return models.ExecResult(
            exit_code=self.exit.code,
            stdout=bytes(self.stdout),
            stderr=bytes(self.stderr),
            duration=self.exit.duration_ms / 1000,
            timed_out=self.exit.timed_out,
            signal=self.exit.signal,
            exec_id=self.start.exec_id if self.start else "",
            pid=self.start.pid if self.start else 0,
        )


def finish_exec(collector: ExecCollector, raise_on_timeout: bool, check: bool) -> models.ExecResult:
    res = collector.result()
    if res.timed_out and raise_on_timeout:
        raise errors.ExecTimeout(res)
    if check:
        res.check()
    return res


# ---------------------------------------------------------------- batches, events


def batch_create_call(
    count: int, spec: dict[str, Any], labels: Mapping[str, str] | None, retry_on_oom: bool, retry_on_lost: bool = False
) -> Call[models.BatchInfo]:
    body: dict[str, Any] = {"count": int(count), "spec": spec}
    if labels:
        body["labels"] = {str(k): str(v) for k, v in labels.items()}
    if retry_on_oom:
        body["retry_on_oom"] = True
    if retry_on_lost:
        body["retry_on_lost"] = True
    return Call("POST", "/v1/batches", json_of(models.BatchInfo), json=body)


def batch_get_call(bid: str) -> Call[models.BatchInfo]:
    return Call("GET", f"/v1/batches/{bid}", json_of(models.BatchInfo), idempotent=True)


def batch_list_call() -> Call[list[models.BatchInfo]]:
    return Call("GET", "/v1/batches", json_list(models.BatchInfo), idempotent=True)


def batch_delete_call(bid: str) -> Call[models.BatchInfo]:
    return Call("DELETE", f"/v1/batches/{bid}", json_of(models.BatchInfo), idempotent=True)


def batch_done(info: models.BatchInfo, until: str) -> bool:
    """``ready``: every member submitted and past ``queued``/``creating``;
    ``done``: every member submitted and finished (final or kept)."""
    if info.submitted < info.count:
        return info.deleted_at is not None and info.live == 0
    if until == "ready":
        return info.count_in("queued", "creating") == 0
    if until == "done":
        return info.live == 0
    raise ValueError(f"until must be 'ready' or 'done', not {until!r}")


def events_call(
    sandbox: str | None,
    labels: Labels | None,
    batch: str | None,
    type: str | None,
    after: int,
    follow: bool,
    limit: int = 10000,
) -> Call[list[models.Event]]:
    """A page of events after ``after`` (a JSON list), or with ``follow`` an
    NDJSON stream of them (read with :func:`parse_event`)."""
    params: dict[str, str] = {"after": str(after)}
    if sandbox:
        params["sandbox"] = sandbox
    sel = selector(labels)
    if sel:
        params["label"] = sel
    if batch:
        params["batch"] = batch
    if type:
        params["type"] = type
    if follow:
        params["follow"] = "true"
    else:
        params["limit"] = str(limit)
    return Call(
        "GET",
        "/v1/events",
        json_list(models.Event),
        params=params,
        idempotent=True,
        stream=follow,
        no_read_timeout=follow,
    )


def parse_event(line: str) -> models.Event | None:
    if not line.strip():
        return None
    return from_json(models.Event, json.loads(line))


# ---------------------------------------------------------------- images, profiles, nodes


def images_list_call() -> Call[list[models.Image]]:
    return Call("GET", "/v1/images", json_list(models.Image), idempotent=True)


def image_pull_call(reference: str, progress: bool) -> Call[models.Image]:
    return Call(
        "POST",
        "/v1/images/pull",
        json_of(models.Image),
        params={"progress": "true"} if progress else None,
        json={"reference": reference},
        idempotent=True,
        stream=progress,
        no_read_timeout=True,
    )


def pull_line(line: str) -> models.PullEvent | models.Image | None:
    """A pull progress line: an event, or the final image record (an error
    line raises its API error)."""
    if not line.strip():
        return None
    ev = json.loads(line)
    kind = ev.get("type")
    if kind == "image":
        return from_json(models.Image, ev["image"])
    if kind == "error":
        e = ev.get("error") or {}
        status = {v.code: s for s, v in errors._BY_STATUS.items()}.get(e.get("code", ""), 500)
        raise errors.error_for(status, e.get("code"), e.get("message", "pull failed"), None)
    return from_json(models.PullEvent, ev)


def image_prewarm_call(reference: str, nodes: Sequence[str] | None) -> Call[models.PrewarmResult]:
    return Call(
        "POST",
        "/v1/images/prewarm",
        json_of(models.PrewarmResult),
        json={"reference": reference, "nodes": list(nodes or [])},
        idempotent=True,
        no_read_timeout=True,
    )


def image_delete_call(reference: str) -> Call[models.Image]:
    return Call("DELETE", f"/v1/images/{reference}", json_of(models.Image), idempotent=True)


def image_import_call(name: str, content: Any) -> Call[models.Image]:
    return Call(
        "POST",
        "/v1/images/import",
        json_of(models.Image),
        params={"name": name},
        content=content,
        headers={"Content-Type": "application/x-tar"},
        no_read_timeout=True,
    )


def build_call(
    context: str | os.PathLike[str],
    tag: str | None,
    dockerfile: str,
    build_args: Mapping[str, str] | None,
    target: str | None,
    allow: Sequence[str] | None,
    test: str | None,
    push: str | None,
    no_cache: bool,
) -> Call[Any]:
    """``POST /v1/builds``: the directory ``context`` as a tar, streamed."""
    params: list[tuple[str, str | int | float | bool | None]] = [("dockerfile", dockerfile)]
    for k, v in (("tag", tag), ("target", target), ("test", test), ("push", push)):
        if v is not None:
            params.append((k, v))
    params += [("build_arg", f"{k}={v}") for k, v in (build_args or {}).items()]
    params += [("allow", rule) for rule in allow or ()]
    if no_cache:
        params.append(("no_cache", "true"))
    return Call(
        "POST",
        "/v1/builds",
        lambda _: None,
        params=params,
        content=tar_stream(context),
        headers={"Content-Type": "application/x-tar"},
        stream=True,
        no_read_timeout=True,
    )


class BuildTracker:
    """Reads a build's event lines: each event for ``on_event``, then the
    result (or :class:`errors.BuildFailed`)."""

    def __init__(self) -> None:
        self.events: list[models.BuildEvent] = []
        self.id: str | None = None

    def line(self, line: str) -> models.BuildEvent | None:
        if not line.strip():
            return None
        ev = from_json(models.BuildEvent, json.loads(line))
        self.events.append(ev)
        if ev.type == "build":
            self.id = ev.raw.get("id")
        return ev

    def result(self) -> models.BuildResult:
        last = self.events[-1] if self.events else None
        if last is not None and last.type == "done":
            return models.BuildResult(
                id=self.id or "",
                digest=last.raw["digest"],
                tag=last.raw.get("tag"),
                seconds=float(last.raw.get("seconds", 0.0)),
                events=self.events,
            )
        if last is not None and last.type == "failed":
            raise errors.BuildFailed(last.raw.get("message", "the build failed"), last.raw.get("line"), self.id, self.events)
        raise errors.StreamError(f"the build {self.id} ended without a result")


def image_push_call(reference: str, source: str | None) -> Call[models.PushResult]:
    return Call(
        "POST",
        "/v1/images/push",
        json_of(models.PushResult),
        json={"reference": reference, "source": source},
        idempotent=True,
        no_read_timeout=True,
    )


def image_gc_call(budget: int | str | None) -> Call[models.GcReport]:
    return Call("POST", "/v1/images/gc", json_of(models.GcReport), json={"budget": None if budget is None else str(budget)})


def profiles_list_call() -> Call[list[models.Profile]]:
    return Call("GET", "/v1/profiles", json_list(models.Profile), idempotent=True)


def profile_get_call(name: str) -> Call[models.ProfileDetail]:
    return Call("GET", f"/v1/profiles/{name}", json_of(models.ProfileDetail), idempotent=True)


def profile_reset_call(name: str) -> Call[models.Profile]:
    return Call("POST", f"/v1/profiles/{name}/reset", json_of(models.Profile), idempotent=True)


def profiles_export_call() -> Call[str]:
    return Call("GET", "/v1/profiles/export", lambda r: r.text, idempotent=True)


def profiles_import_call(toml: str | bytes | os.PathLike[str]) -> Call[list[models.Profile]]:
    if isinstance(toml, os.PathLike):
        toml = Path(toml).read_bytes()
    content = toml.encode() if isinstance(toml, str) else toml
    return Call(
        "POST",
        "/v1/profiles/import",
        json_list(models.Profile),
        content=content,
        headers={"Content-Type": "application/toml"},
        idempotent=True,
    )


def nodes_call() -> Call[list[models.Node]]:
    return Call("GET", "/v1/nodes", json_list(models.Node), idempotent=True)


def health_call() -> Call[str]:
    return Call("GET", "/healthz", lambda r: r.text.strip(), idempotent=True)


def openapi_call() -> Call[dict[str, Any]]:
    return Call("GET", "/openapi.json", lambda r: r.json(), idempotent=True)


# ---------------------------------------------------------------- ports


def port_path(sid: str, port: int, path: str = "") -> str:
    return sb_path(sid, f"/ports/{int(port)}/{path.lstrip('/')}")


def port_link_call(sid: str, port: int) -> Call[str]:
    """A link that opens the port in a browser, on its own origin (valid
    for minutes; the browser that opens it keeps access)."""
    return Call("GET", sb_path(sid, f"/ports/{int(port)}"), lambda r: r.json()["url"], idempotent=True)


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    tls: bool
    prefix: str


def endpoint(url: str) -> Endpoint:
    u = httpx.URL(url)
    tls = u.scheme == "https"
    return Endpoint(u.host, u.port or (443 if tls else 80), tls, u.path.rstrip("/"))


def upgrade_request(ep: Endpoint, token: str, sid: str, port: int) -> bytes:
    """The HTTP/1.1 request that turns a connection into a raw tunnel to
    ``port`` in the sandbox (``Upgrade: tcp``)."""
    host = ep.host if ":" not in ep.host else f"[{ep.host}]"
    return (
        f"POST {ep.prefix}{sb_path(sid, f'/ports/{int(port)}')} HTTP/1.1\r\n"
        f"Host: {host}:{ep.port}\r\n"
        f"Authorization: Bearer {token}\r\n"
        f"User-Agent: {USER_AGENT}\r\n"
        "Connection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: 0\r\n\r\n"
    ).encode()


def upgrade_head(head: bytes) -> tuple[int, dict[str, str]]:
    """Status and headers of the answer to :func:`upgrade_request`."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = int(parts[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return status, headers


def upgrade_error(status: int, headers: dict[str, str], body: bytes) -> errors.APIError:
    resp = httpx.Response(status, headers=headers, content=body)
    return api_error(resp)


# ---------------------------------------------------------------- lease keeper


class LeaseSchedule:
    """When each kept sandbox needs its next heartbeat: a third of its lease
    after the last call that touched it (any call on a sandbox renews its
    lease, so a busy sandbox needs no extra heartbeats). Not thread-safe;
    the sync client guards it with a lock."""

    def __init__(self) -> None:
        self._every: dict[str, float] = {}
        self._next: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._every)

    def add(self, sid: str, lease: float, now: float) -> None:
        every = max(lease / 3, 0.05)
        self._every[sid] = every
        self._next[sid] = now + every

    def remove(self, sid: str) -> None:
        self._every.pop(sid, None)
        self._next.pop(sid, None)

    def touched(self, sid: str, now: float) -> None:
        every = self._every.get(sid)
        if every is not None:
            self._next[sid] = now + every

    def due(self, now: float) -> list[str]:
        return [sid for sid, t in self._next.items() if t <= now]

    def next_wake(self, now: float) -> float | None:
        """Seconds until the next heartbeat is due (None: nothing to keep)."""
        if not self._next:
            return None
        return max(min(self._next.values()) - now, 0.0)


def reclaim_on_exit(spec: models.SandboxSpec, failed: bool) -> bool:
    """Whether leaving a ``with`` block destroys the sandbox: not for
    ``reclaim="keep"``, nor for ``keep_on_failure`` when the block raised
    (the sandbox then stays until its TTL or lease ends it, and is kept for
    ``keep_for`` after that)."""
    if spec.reclaim == "keep":
        return False
    if spec.reclaim == "keep_on_failure" and failed:
        return False
    return True
