"""Alerts: the events an operator is paged for, sent to webhooks in
Alertmanager's format as they are recorded."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from conftest import free_port, own_daemon
from helpers import wait_until


def receiver():
    """A webhook receiver on loopback: (server, the bodies it got)."""
    got = []

    class Hook(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.append((self.path, json.loads(body)))
            self.send_response(200)
            self.end_headers()

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, got


def test_an_oom_kill_is_sent_to_every_hook_once_and_a_dead_hook_blocks_nothing(images):
    srv, got = receiver()
    dead = f"http://127.0.0.1:{free_port()}/nobody"
    args = ["--alert-webhook", dead, "--alert-webhook", f"http://127.0.0.1:{srv.server_address[1]}/hook"]
    try:
        with own_daemon(images, args=args) as w:
            quiet = w.create(labels={"task": "calm"})["id"]
            w.destroy(quiet)
            sid = w.create(memory="64M", labels={"task": "swe"}, cmd=["tail", "/dev/zero"])["id"]
            wait_until(lambda: got, timeout=30, what="the OOM alert")
            w.create(memory="64M", cmd=["tail", "/dev/zero"])
            wait_until(lambda: len(got) == 2, timeout=30, what="the second OOM alert")
    finally:
        srv.shutdown()
    path, msg = got[0]
    assert path == "/hook" and msg["version"] == "4" and msg["status"] == "firing", msg
    (alert,) = msg["alerts"]
    assert alert["labels"] == {"alertname": "oom_killed", "severity": "critical", "sandbox": sid,
                               "node": alert["labels"]["node"], "task": "swe"}, alert
    assert alert["startsAt"].startswith("20") and alert["annotations"]["summary"], alert
    # One message per kill: its `destroyed` event is not a second alert,
    # and the calm sandbox's end none at all.
    assert [m["alerts"][0]["labels"]["alertname"] for _, m in got] == ["oom_killed", "oom_killed"]


def test_a_webhook_that_is_not_an_http_url_is_refused_at_start(warren):
    p = warren.cli("up", "--home", "/nonexistent/x", "--alert-webhook", "ftp://x", check=False)
    assert p.returncode != 0 and b"an http:// or https:// URL" in p.stderr, p.stderr
