"""Typed records of the Warren API.

Plain dataclasses (no pydantic): the SDK's only dependency is httpx, so it
installs into any training environment without pinning a pydantic major
version against the trainer's own. Each model mirrors one schema of the
daemon's ``GET /openapi.json`` field for field (``tests/test_sdk.py`` fails
when they drift apart); fields the server adds later are ignored rather
than refused, and every record keeps the JSON it came from in ``raw``.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import sys
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, Union

__all__ = [
    "SandboxState",
    "SandboxSpec",
    "NetworkSpec",
    "ResolvedResources",
    "Usage",
    "UsageSample",
    "Quota",
    "TenantUsage",
    "Tenant",
    "Token",
    "NewToken",
    "WhoAmI",
    "AuditEntry",
    "Event",
    "SandboxInfo",
    "BatchCost",
    "BatchFailure",
    "BatchInfo",
    "NetworkChange",
    "Resources",
    "Node",
    "ProfileRequest",
    "Profile",
    "ProfileRun",
    "ProfileDetail",
    "PrewarmNode",
    "PrewarmResult",
    "ImageLayer",
    "Image",
    "PushResult",
    "GcReport",
    "LogLine",
    "PullEvent",
    "PathKind",
    "PathEntry",
    "ExecStart",
    "ExecOutput",
    "ExecExit",
    "ExecEvent",
    "ExecResult",
    "from_json",
]

SandboxState = Literal[
    "queued", "creating", "running", "paused", "stopping", "destroyed", "failed", "kept", "lost", "preempted"
]
"""A sandbox's state. ``destroyed``, ``failed`` and ``lost`` are final."""

FINAL_STATES: frozenset[str] = frozenset({"destroyed", "failed", "lost", "preempted"})

M = TypeVar("M")


def from_json(cls: type[M], data: Any) -> M:
    """Builds dataclass ``cls`` from decoded JSON: nested records, lists,
    maps and optionals are converted by the field's type hint; unknown keys
    are ignored; the input is kept in ``raw`` where the model has it."""
    return typing.cast(M, _convert(cls, data))


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    h = _HINTS.get(cls)
    if h is None:
        h = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
        _HINTS[cls] = h
    return h


def _convert(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if not isinstance(value, dict):
            raise TypeError(f"{hint.__name__}: expected an object, got {type(value).__name__}")
        hints = _hints(hint)
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(hint):
            if not f.init:
                continue
            if f.name == "raw":
                kwargs["raw"] = value
                continue
            key = f.metadata.get("json", f.name)
            if key in value:
                kwargs[f.name] = _convert(hints[f.name], value[key])
        return hint(**kwargs)
    origin = typing.get_origin(hint)
    if origin is Union or origin is types.UnionType:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return _convert(args[0], value)
        return value
    if origin is list:
        (item,) = typing.get_args(hint)
        return [_convert(item, v) for v in value]
    if origin is dict:
        _, item = typing.get_args(hint)
        return {k: _convert(item, v) for k, v in value.items()}
    if hint is float and isinstance(value, int):
        return float(value)
    return value


def _raw() -> Any:
    return field(default_factory=dict, repr=False, compare=False)


# ---------------------------------------------------------------- sandboxes


@dataclass
class NetworkSpec:
    """Egress: ``none`` (loopback only), ``allowlist`` of ``HOST:PORT`` rules,
    or ``open`` (any public address, on nodes that permit it)."""

    mode: Literal["none", "allowlist", "open"] = "none"
    allow: list[str] = field(default_factory=list)
    deny: list[str] = field(default_factory=list)


@dataclass
class ForkOrigin:
    """Where a forked sandbox's filesystem came from: the sandbox it was
    forked from and the read-only layers (on that sandbox's node) its root
    is built on, topmost first; ``processes``: it resumed the source's
    memory and processes too (a gvisor fork with processes)."""

    source: str
    layers: list[str] = field(default_factory=list)
    processes: bool = False


@dataclass
class VolumeMount:
    """A volume mounted into a sandbox at ``path`` (read-only mounts
    share; a read-write one is the only one while it lasts)."""

    name: str
    path: str
    read_only: bool = False


@dataclass
class SecretRef:
    """A secret given to a sandbox: as the environment variable ``env``, or
    as the file ``/run/secrets/<target>`` (``/run/secrets/<name>`` when
    neither is given). A create also takes ``"NAME[,env=VAR|,target=FILE]"``."""

    name: str
    env: str | None = None
    target: str | None = None


@dataclass
class Secret:
    """A secret (``client.secrets``) as every read shows it: never its value."""

    name: str
    id: str
    version: int
    metadata: dict[str, str] = field(default_factory=dict)
    created_at: str = ""
    updated_at: str = ""
    raw: dict[str, Any] = _raw()


@dataclass
class Quota:
    """What a tenant's live sandboxes may request in all (None: no bound):
    ``cpu`` in cores, ``memory`` in bytes."""

    cpu: float | None = None
    memory: int | None = None
    gpus: int | None = None
    sandboxes: int | None = None


@dataclass
class TenantUsage:
    """What a tenant's live sandboxes request now."""

    cpu_millis: int = 0
    memory: int = 0
    gpus: int = 0
    sandboxes: int = 0


@dataclass
class Tenant:
    """A tenant (``client.tenants``): its quota and share of the cluster,
    what its sandboxes hold now and how many of its creates wait."""

    name: str
    created_at: str
    quota: Quota = field(default_factory=Quota)
    weight: int = 1
    priority: int = 0
    preempt: bool = False
    egress: list[str] | None = None
    usage: TenantUsage = field(default_factory=TenantUsage)
    queued: int = 0
    raw: dict[str, Any] = _raw()


@dataclass
class Token:
    """A tenant's token as listed (``client.tokens``): never its value."""

    id: str
    tenant: str
    role: str
    created_at: str
    description: str = ""
    raw: dict[str, Any] = _raw()


@dataclass
class NewToken(Token):
    """A token just made: ``token`` is its value, shown this once."""

    token: str = ""


@dataclass
class WhoAmI:
    """Who the client's token is (``client.whoami()``): its tenant, and
    ``operator`` or its role there."""

    tenant: str
    role: str
    token: str
    raw: dict[str, Any] = _raw()


@dataclass
class AuditEntry:
    """One call that changed something, as the audit log keeps it."""

    time: str
    tenant: str
    token: str
    door: str
    method: str
    route: str
    status: int
    target: str = ""
    raw: dict[str, Any] = _raw()


@dataclass
class Volume:
    """A volume (``client.volumes``): its node, size and bytes used (in
    bytes), and the live sandboxes mounting it."""

    name: str
    size: int
    used: int = 0
    node: str = ""
    created_at: str = ""
    mounted_by: list[str] = field(default_factory=list)
    raw: dict[str, Any] = _raw()


@dataclass
class SandboxSpec:
    """What a sandbox was asked for (as the server echoes it back): sizes
    (``cpu`` in cores, ``memory``/``disk`` in bytes or text; ``cpu`` and
    ``memory`` are the enforced limits, ``cpu_request``/``memory_request``
    what the scheduler reserves), lifetimes as text (``"10m"``), the main
    command if any."""

    image: str
    name: str | None = None
    """Unique among live sandboxes; usable wherever the id is."""
    cpu: float | str | None = None
    memory: int | str | None = None
    cpu_request: float | str | None = None
    memory_request: int | str | None = None
    pids: int | None = None
    disk: int | str | None = None
    gpus: int | None = None
    """Devices of the node's GPU kind (docs/gpu.md)."""
    devices: list[str] = field(default_factory=list)
    """CDI devices by full name, e.g. ``["nvidia.com/gpu=0"]``."""
    volumes: list[VolumeMount] = field(default_factory=list)
    """Volumes mounted into it; a create also takes ``"NAME:/PATH[:ro]"``."""
    secrets: list[SecretRef] = field(default_factory=list)
    """Secrets given to it (names only: a spec never holds a value)."""
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    ttl: str | int | float | None = None
    lease: str | int | float | None = None
    profile: str | None = None
    network: NetworkSpec = field(default_factory=NetworkSpec)
    reclaim: Literal["destroy", "delay", "keep", "keep_on_failure", "pause"] = "destroy"
    keep_for: str | int | float | None = None
    cmd: list[str] | None = None
    cwd: str | None = None
    user: str | None = None
    request_id: str | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    placement: Literal["spread", "pack"] = "spread"
    isolation: Literal["container", "gvisor"] | None = None
    """What stands between its code and the host: ``"container"`` (the host
    kernel behind namespaces and seccomp) or ``"gvisor"`` (gVisor's
    user-space kernel). A create that names none gets its node's default;
    the server's answer names the class it runs in."""
    priority: int | None = None
    """Its place in its tenant's queue: higher starts first and is preempted
    last. None: its tenant's priority, the most a tenant's token may give."""
    fork: ForkOrigin | None = None
    """Set on the children of a fork (:meth:`warren.Sandbox.fork`)."""


@dataclass
class ResolvedResources:
    """The resources a sandbox was given once defaults and profiles applied:
    limits (``cpu_millis``, ``memory``) and what admission reserved."""

    cpu_millis: int
    memory: int
    pids: int
    disk: int
    gpus: int
    cpu_request_millis: int | None = None
    memory_request: int | None = None


@dataclass
class Usage:
    """cgroup usage: CPU time, memory (now and peak), pids, OOM kills, disk."""

    cpu_usage_ns: int = 0
    memory_bytes: int = 0
    memory_peak_bytes: int = 0
    pids: int = 0
    oom_kills: int = 0
    cpu_millis_mean: int = 0
    cpu_millis_peak: int = 0
    cpu_millis_last: int = 0
    """The newest CPU rate (millicores): what is in use now."""
    cpu_periods: int = 0
    cpu_throttled_periods: int = 0
    disk_bytes: int = 0
    samples: int = 0
    runtime_ms: int = 0
    memory_byte_seconds: int = 0
    """Memory held over time (byte-seconds; GB-seconds ÷ 10⁹)."""
    gpu_memory_bytes: int = 0
    """GPU memory its processes hold (NVML nodes, GPU sandboxes; else 0)."""
    gpu_memory_peak_bytes: int = 0
    gpu_utilization_percent: int = 0


@dataclass
class UsageSample:
    """A usage reading of a sandbox as its node shipped it (one every 15 s
    while it runs), kept by the control plane after the sandbox and its node
    are gone."""

    sandbox_id: str
    time_ms: int
    """When it was read (milliseconds since the Unix epoch)."""
    usage: Usage


@dataclass
class Event:
    """A state change (or node event) with its reason, from ``/v1/events``."""

    seq: int
    time: str
    sandbox_id: str
    type: str
    reason: str
    state: SandboxState | None = None
    message: str = ""


@dataclass
class SandboxInfo:
    """A sandbox as ``GET /v1/sandboxes/{id}`` describes it."""

    id: str
    state: SandboxState
    reason: str
    spec: SandboxSpec
    resources: ResolvedResources
    node: str
    image_digest: str
    created_at: str
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    pid: int | None = None
    host_id_base: int | None = None
    queue_position: int | None = None
    waiting_for: str | None = None
    usage: Usage | None = None
    ttl_remaining_ms: int | None = None
    lease_remaining_ms: int | None = None
    events: list[Event] = field(default_factory=list)
    tenant: str = "default"
    raw: dict[str, Any] = _raw()

    @property
    def labels(self) -> dict[str, str]:
        return self.spec.labels

    @property
    def is_final(self) -> bool:
        """Destroyed, failed or lost: nothing of it runs any more."""
        return self.state in FINAL_STATES


# ---------------------------------------------------------------- batches


@dataclass
class BatchFailure:
    sandbox_id: str
    state: SandboxState
    reason: str
    exit_code: int | None = None


@dataclass
class BatchCost:
    """A batch's usage in billing units, summed over its members, ended
    ones included."""

    cpu_seconds: float = 0.0
    memory_gb_seconds: float = 0.0
    """Memory held over time (byte-seconds ÷ 10⁹)."""
    gpu_seconds: float = 0.0
    """Each member's GPUs × its run time."""


@dataclass
class BatchInfo:
    """A batch: how many were asked for and submitted, counts per state,
    usage summed over its members (live ones as last sampled, ended ones as
    they ended), failures, the members that succeeded and the cost."""

    id: str
    count: int
    labels: dict[str, str]
    spec: SandboxSpec
    created_at: str
    submitted: int
    states: dict[str, int]
    usage: Usage
    failures: list[BatchFailure]
    succeeded: int = 0
    """Members that ended and are not among the failures."""
    cost: BatchCost = field(default_factory=BatchCost)
    deleted_at: str | None = None
    retry_on_oom: bool = False
    retry_on_lost: bool = False
    tenant: str = "default"
    raw: dict[str, Any] = _raw()

    def count_in(self, *states: str) -> int:
        """Members currently in any of ``states``."""
        return sum(self.states.get(s, 0) for s in states)

    @property
    def pending(self) -> int:
        """Members not yet ready: unsubmitted, queued or creating."""
        return max(self.count - self.submitted, 0) + self.count_in("queued", "creating")

    @property
    def live(self) -> int:
        return self.count_in("queued", "creating", "running", "paused", "stopping")


# ---------------------------------------------------------------- network, nodes


@dataclass
class NetworkChange:
    """The answer to a rule change: the sandbox, the live connections the new
    rules closed, and ports a server in the sandbox already listens on."""

    sandbox: SandboxInfo
    closed: list[str]
    unlistened_ports: list[int] = field(default_factory=list)


@dataclass
class Resources:
    cpu_millis: int
    memory: int
    slots: int
    gpus: int = 0
    """Devices of the node's GPU kind (docs/gpu.md)."""


@dataclass
class DeviceClass:
    """A node's CDI devices of one kind, and those a sandbox holds."""

    kind: str
    devices: list[str]
    used: list[str] = field(default_factory=list)
    gpu: bool = False
    """The kind ``gpus`` requests take on that node."""


@dataclass
class NodeLoad:
    """How busy a node said it was."""

    cpu_busy: float = 0.0
    disk_pressure: bool = False
    memory_pressure: bool = False


@dataclass
class Node:
    """A node: its state, labels, what it lends, what is allocated, how
    many creates wait (the queue is the cluster's)."""

    name: str
    allocatable: Resources
    allocated: Resources
    queued: int
    state: Literal["ready", "unreachable", "lost"] = "ready"
    cordoned: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    url: str = ""
    initializing: int = 0
    sandboxes: int = 0
    load: NodeLoad = field(default_factory=NodeLoad)
    last_seen_ms: int = 0
    devices: list[DeviceClass] = field(default_factory=list)
    isolation: list[str] = field(default_factory=lambda: ["container"])
    """The isolation classes it runs, its default first."""


# ---------------------------------------------------------------- profiles


@dataclass
class ProfileRequest:
    """A CPU (millicores) and memory (bytes) request, and the GPU memory
    (bytes) the task's runs suggest (0 for a task that used no GPU)."""

    cpu_millis: int
    memory: int
    gpu_memory: int = 0


@dataclass
class Profile:
    """A learned resource profile (one per task label)."""

    name: str
    original: ProfileRequest
    current: ProfileRequest
    anomalous: bool
    anomaly: str = ""
    runs: int = 0


@dataclass
class ProfileRun:
    """One finished sandbox of a profile, as the sampler saw it."""

    cpu_millis_peak: int
    memory_peak: int
    runtime_ms: int
    oom_killed: bool
    throttled_ratio: float
    requested: ProfileRequest
    gpu_memory_peak: int = 0


@dataclass
class ProfileDetail:
    profile: Profile
    runs: list[ProfileRun]
    recommendation: ProfileRequest | None = None


# ---------------------------------------------------------------- images


@dataclass
class PrewarmNode:
    node: str
    digest: str
    layers: int


@dataclass
class PrewarmResult:
    reference: str
    nodes: list[PrewarmNode]


@dataclass
class ImageLayer:
    digest: str
    size: int = 0
    diff_id: str = ""
    chain_id: str = ""
    snapshot: int | None = None


@dataclass
class Image:
    """An image record of the store. (``/openapi.json`` does not describe
    this record; the fields are those the daemon sends today, and ``raw``
    holds all of them.)"""

    name: str
    digest: str
    size: int = 0
    created: str | None = None
    config_digest: str = ""
    layers: list[ImageLayer] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = _raw()


@dataclass
class PushResult:
    image: Image
    uploaded: int
    mounted: int


@dataclass
class GcReport:
    removed: list[str]
    used_before: int
    used_after: int


@dataclass
class PullEvent:
    """One progress event of an image pull (``resolved``, ``manifest``,
    ``progress``, ``layer``, ``done``); every field the server sent is in
    ``raw``."""

    type: str
    digest: str | None = None
    layer: int | None = None
    bytes: int | None = None
    size: int | None = None
    raw: dict[str, Any] = _raw()


@dataclass
class BuildEvent:
    """One event of an image build (``build``, ``step``, ``output``,
    ``step_done``, ``warning``, ``test``, ``done``, ``failed``); every field
    the server sent is in ``raw``."""

    type: str
    step: int | None = None
    instruction: str | None = None
    text: str | None = None
    cached: bool | None = None
    raw: dict[str, Any] = _raw()


@dataclass
class BuildResult:
    """A finished build: the image digest and the tag it now has."""

    id: str
    digest: str
    tag: str | None
    seconds: float
    events: list[BuildEvent] = field(default_factory=list)


# ---------------------------------------------------------------- logs, files


@dataclass
class LogLine:
    """One line of a sandbox's log: ``stdout``/``stderr`` output (of the main
    process, ``exec_id`` ``main``, or of an exec), a state ``event`` or the
    final ``summary``."""

    time: str
    sandbox_id: str
    kind: str
    exec_id: str | None = None
    text: str | None = None
    data: str | None = None
    state: str | None = None
    reason: str | None = None
    message: str | None = None
    raw: dict[str, Any] = _raw()

    @property
    def output(self) -> bytes:
        """The output bytes of a ``stdout``/``stderr`` line (empty otherwise)."""
        if self.text is not None:
            return self.text.encode()
        if self.data is not None:
            return base64.b64decode(self.data)
        return b""


PathKind = Literal["file", "dir", "symlink", "other"]
"""What a path is (``other``: a device, FIFO or socket)."""


@dataclass
class PathEntry:
    """A path in a sandbox as its processes see it (``Files.stat``,
    ``list``, ``mkdir``, ``rename``): owner ids inside the sandbox, ``mode``
    its permission bits, ``modified_ms`` Unix milliseconds. A symlink is
    described (``symlink_target``), never followed."""

    path: str
    kind: PathKind
    size: int
    mode: int
    uid: int
    gid: int
    modified_ms: int
    symlink_target: str | None = None
    xattrs: dict[str, str] = field(default_factory=dict)
    """A regular file's extended attributes in the ``user.`` namespace."""
    accessed_ms: int | None = None
    """Last access and last inode change, Unix milliseconds (where known)."""
    changed_ms: int | None = None
    raw: dict[str, Any] = _raw()

    @property
    def name(self) -> str:
        """The last component of ``path`` (``/`` for the root)."""
        return self.path.rstrip("/").rsplit("/", 1)[-1] or "/"

    @property
    def is_dir(self) -> bool:
        return self.kind == "dir"

    @property
    def is_file(self) -> bool:
        return self.kind == "file"

    @property
    def is_symlink(self) -> bool:
        return self.kind == "symlink"

    @property
    def modified(self) -> datetime.datetime:
        """``modified_ms`` as an aware UTC datetime."""
        return datetime.datetime.fromtimestamp(self.modified_ms / 1000, tz=datetime.timezone.utc)


# ---------------------------------------------------------------- exec


@dataclass
class ExecStart:
    """The command started: its exec id and its pid inside the sandbox."""

    exec_id: str
    pid: int
    type: Literal["start"] = "start"


@dataclass
class ExecOutput:
    """A chunk of output, in the order the sandbox produced it."""

    stream: Literal["stdout", "stderr"]
    data: bytes

    @property
    def type(self) -> Literal["stdout", "stderr"]:
        return self.stream

    @property
    def text(self) -> str:
        return self.data.decode(errors="replace")


@dataclass
class ExecExit:
    """The command ended: exit code (128+N for signal N), whether the
    exec's timeout killed it, and how long it ran."""

    code: int
    duration_ms: int
    timed_out: bool = False
    signal: int | None = None
    type: Literal["exit"] = "exit"


ExecEvent = Union[ExecStart, ExecOutput, ExecExit]
"""What ``exec_stream`` yields."""


@dataclass
class ExecResult:
    """The outcome of a finished command."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    duration: float
    """Seconds the command ran (as the sandbox measured it)."""
    timed_out: bool = False
    signal: int | None = None
    exec_id: str = ""
    pid: int = 0

    @property
    def stdout_text(self) -> str:
        return self.stdout.decode(errors="replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode(errors="replace")

    @property
    def text(self) -> str:
        """``stdout`` as text (what most callers want)."""
        return self.stdout_text

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def check(self) -> ExecResult:
        """Returns self, or raises :class:`warren.CommandFailed` when the
        command exited non-zero."""
        if self.exit_code != 0:
            from .errors import CommandFailed

            raise CommandFailed(self)
        return self
