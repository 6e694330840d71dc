"""A cluster on this machine: one `warren server` and node agents
(`warren node`), each with its own home, port and a declared capacity small
enough that placement decisions are visible."""

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import httpx

import helpers
from conftest import WARREN, Warren, free_port, hermetic, stop_process


def wait_until(what, check, timeout=20.0, every=0.1):
    """helpers.wait_until, with the cluster's longer default wait."""
    return helpers.wait_until(check, timeout=timeout, interval=every, what=what)


class Server(Warren):
    """`warren server` with the Warren test client's helpers."""

    def __init__(self, home: Path, port: int, database=None, extra_args=(), host="127.0.0.1"):
        super().__init__(home, port, extra_args=extra_args)
        self.database = database
        self.host = host
        self.url = f"http://{host}:{port}"

    def start(self):
        self.log = open(self.home.parent / f"server-{self.port}.log", "ab")
        args = [str(WARREN), "server", "--home", str(self.home), "--listen", f"{self.host}:{self.port}"]
        if self.database:
            args += ["--database", self.database]
        args += self.extra_args
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=self.log)
        wait_until("warren server to answer", self._healthy, timeout=20, every=0.05)
        self.token = (self.home / "token").read_text().strip()
        self.http = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60
        )

    def _healthy(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"warren server exited with {self.proc.returncode}")
        try:
            r = httpx.get(self.url + "/healthz", timeout=1)
            return r.status_code == 200 and r.text.strip() == "ok"
        except httpx.HTTPError:
            return False

    def env(self):
        return {**super().env(), "WARREN_URL": self.url}

    def nodes(self):
        r = self.http.get("/v1/nodes")
        assert r.status_code == 200, r.text
        return {n["name"]: n for n in r.json()}


class Node:
    """`warren node` joined to `server`."""

    def __init__(self, base: Path, server: Server, name: str, cpu="2", memory="2G", labels=(), also=(),
                 host=None, extra=()):
        self.name = name
        # A NetHost: the agent runs in its network namespace, at its address.
        self.host = host
        # Every replica the agent may report to, in order.
        self.servers = [server.url, *also]
        self.home = base / name
        self.home.mkdir(parents=True, exist_ok=True)
        self.server = server
        self.port = free_port()
        # The node API is TLS, with a certificate the server pins at join.
        self.address = host.address if host else "127.0.0.1"
        self.url = f"https://{self.address}:{self.port}"
        self.args = [
            "--capacity-cpu", cpu, "--capacity-memory", memory,
            "--cpu-overcommit", "1", "--reserve-cpu", "0", "--reserve-memory", "0",
            # Placement, not this machine's free space, is under test.
            "--disk-floor", "512M",
            *[a for l in labels for a in ("--label", l)],
            *extra,
        ]
        self.proc = None

    def start(self):
        hermetic(self.home)
        self.log = open(self.home.parent / f"node-{self.name}.log", "ab")
        # nsenter, not `ip netns exec`: that one also remounts /sys, which
        # would hide the cgroup hierarchies from the node.
        wrap = ["nsenter", f"--net=/run/netns/{self.host.netns}"] if self.host else []
        self.proc = subprocess.Popen(
            [*wrap, str(WARREN), "node", "--home", str(self.home), "--server", ",".join(self.servers),
             "--join-token", str(self.server.home / "join-token"), "--name", self.name,
             "--listen", f"{self.address}:{self.port}", *self.args],
            stdout=self.log, stderr=self.log,
        )
        self.wait_ready()

    def wait_ready(self, timeout=30):
        def ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"warren node {self.name} exited with {self.proc.returncode}")
            n = self.server.nodes().get(self.name)
            return n if n and n["state"] == "ready" and n["allocatable"]["cpu_millis"] > 0 else None

        return wait_until(f"node {self.name} to be ready", ready, timeout=timeout)

    def stop(self, sig=signal.SIGINT):
        stop_process(self.proc, sig)

    def fingerprint(self):
        """The SHA-256 of the certificate in the node's home."""
        import hashlib
        import ssl
        pem = (self.home / "node-tls" / "cert.pem").read_text()
        return hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest()

    def presented(self):
        """The SHA-256 of the certificate its API presents."""
        import hashlib
        import ssl
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        with socket.create_connection((self.address, self.port), timeout=5) as raw:
            with ctx.wrap_socket(raw) as tls:
                return hashlib.sha256(tls.getpeercert(binary_form=True)).hexdigest()

    def leftovers(self):
        """Sandbox directories this node still has on the host."""
        d = self.home / "sandboxes"
        return sorted(p.name for p in d.iterdir()) if d.exists() else []

    def sweep(self):
        """Removes whatever sandboxes the node still holds: a `warren up`
        on its home takes them over and destroys them when it stops."""
        if not self.leftovers():
            return
        w = Warren(self.home, free_port())
        with contextlib.suppress(Exception):
            w.start()
        w.stop()


class Cluster:
    def __init__(self, images, nodes=(), database=None, also=(), server_args=(), server_host="127.0.0.1"):
        # Other replicas' URLs the node agents also know.
        self.also = list(also)
        self.base = Path(tempfile.mkdtemp(prefix="warren-cluster-"))
        (self.base / "server").mkdir()
        self.images = images
        self.server = Server(self.base / "server", free_port(), database=database, extra_args=server_args,
                             host=server_host)
        self.node_specs = list(nodes)
        self.nodes = {}

    def __enter__(self):
        self.server.start()
        for spec in self.node_specs:
            self.add_node(**spec)
        if self.nodes:
            self.server.cli("image", "import", str(self.images["oci"]), "--name", "busybox:latest")
        return self

    def add_replica(self, port):
        """A second `warren server` on the same database, with the first
        one's tokens (an operator mounts the same secrets into every
        replica's home), listening on `port`; started."""
        home = self.base / "server-b"
        home.mkdir()
        for f in ("token", "join-token", "secrets-key"):
            shutil.copy(self.server.home / f, home / f)
        replica = Server(home, port, database=self.server.database)
        replica.start()
        return replica

    def add_node(self, name, **kw):
        node = Node(self.base, self.server, name, also=self.also, **kw)
        node.start()
        self.nodes[name] = node
        return node

    def __exit__(self, *exc):
        if exc[0] is not None:
            # The processes' own words are the best clue to a failure; the
            # homes are removed below, so they are printed (pytest shows
            # them with the failure).
            for log in sorted(self.base.glob("*.log")):
                with contextlib.suppress(OSError):
                    tail = log.read_bytes()[-6000:].decode(errors="replace")
                    print(f"----- {log.name} (last 6000 bytes) -----\n{tail}")
        with contextlib.suppress(Exception):
            if self.server.proc.poll() is None:
                for s in self.server.http.get("/v1/sandboxes").json():
                    if s["state"] not in ("destroyed", "failed", "lost"):
                        self.server.http.delete(f"/v1/sandboxes/{s['id']}", timeout=60)
        self.server.stop()
        for n in self.nodes.values():
            n.stop()
            n.sweep()
        shutil.rmtree(self.base, ignore_errors=True)
        return False

    def where(self, sid):
        return self.server.http.get(f"/v1/sandboxes/{sid}").json()["node"]


class NetHost:
    """A network namespace standing in for a host of its own: a veth pair
    to this machine, the namespace's end at `address`, a default route
    back. Made with `ip`; removed by `remove` (the namespace's end of the
    pair goes with it)."""

    def __init__(self, tag: str, index: int, subnet: int):
        self.netns = f"wn{tag}{index}"
        self.outer = f"wvh{tag}{index}"
        self.address = f"10.{subnet}.{index}.2"
        self.gateway = f"10.{subnet}.{index}.1"
        ip = lambda *a: subprocess.run(["ip", *a], check=True, capture_output=True)
        ns = lambda *a: ip("-n", self.netns, *a)
        ip("netns", "add", self.netns)
        ip("link", "add", self.outer, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        ip("addr", "add", f"{self.gateway}/30", "dev", self.outer)
        ip("link", "set", self.outer, "up")
        ns("link", "set", "lo", "up")
        ns("addr", "add", f"{self.address}/30", "dev", "eth0")
        ns("link", "set", "eth0", "up")
        ns("route", "add", "default", "via", self.gateway)

    def cut(self, down=True):
        """Takes the link down (a network partition) or up again."""
        subprocess.run(["ip", "link", "set", self.outer, "down" if down else "up"], check=True)

    def remove(self):
        subprocess.run(["ip", "link", "del", self.outer], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)


class ServerAddress:
    """An address of this machine that every NetHost reaches through its
    default route: on the loopback interface (no veth of its own to go
    down with a partition; the kernel may lack the dummy interface)."""

    def __init__(self, tag: str, subnet: int):
        self.address = f"10.{subnet}.0.1"
        subprocess.run(["ip", "addr", "add", f"{self.address}/32", "dev", "lo"], check=True, capture_output=True)

    def remove(self):
        subprocess.run(["ip", "addr", "del", f"{self.address}/32", "dev", "lo"], capture_output=True)
