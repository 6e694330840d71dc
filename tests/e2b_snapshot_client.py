"""E2B SDK user code, unchanged: forks and snapshots (run by
tests/test_e2b.py in a venv with the pinned SDK). argv: the template."""

import contextlib
import sys


@contextlib.contextmanager
def raises(kind):
    try:
        yield
    except kind:
        return
    raise AssertionError(f"{kind.__name__} was not raised")


from e2b import Sandbox
from e2b.exceptions import InvalidArgumentException, SandboxNotFoundException

sbx = Sandbox.create(sys.argv[1])
made = []
try:
    sbx.files.write("/tmp/state.txt", "before")
    # A fork starts from the files as they are; it and its source go on
    # apart.
    forks = sbx.fork(count=2, timeout=60)
    made += forks
    assert len({f.sandbox_id for f in forks} | {sbx.sandbox_id}) == 3
    for f in forks:
        assert f.is_running() and f.files.read("/tmp/state.txt") == "before"
    forks[0].files.write("/tmp/state.txt", "fork")
    assert sbx.files.read("/tmp/state.txt") == "before"
    assert forks[1].files.read("/tmp/state.txt") == "before"
    with raises(InvalidArgumentException):
        Sandbox.fork(sbx.sandbox_id, count=0)

    # A snapshot is a template: sandboxes start from it by id or name.
    snap = sbx.create_snapshot(name="snap-one")
    assert snap.snapshot_id and snap.names == ["snap-one"], snap
    sbx.files.write("/tmp/state.txt", "after")
    for template in (snap.snapshot_id, "snap-one"):
        s = Sandbox.create(template)
        assert s.files.read("/tmp/state.txt") == "before"
        # Not deleted while a sandbox runs from it.
        with raises(Exception):
            Sandbox.delete_snapshot(snap.snapshot_id)
        s.kill()
    mine = Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items()
    assert [x.snapshot_id for x in mine] == [snap.snapshot_id], mine
    assert Sandbox.list_snapshots(name="snap-none").next_items() == []
    assert Sandbox.delete_snapshot(snap.snapshot_id) is True
    assert Sandbox.delete_snapshot(snap.snapshot_id) is False
    assert Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id).next_items() == []

    gone = Sandbox.create(sys.argv[1])
    gone.kill()
    with raises(SandboxNotFoundException):
        gone.fork()
    with raises(SandboxNotFoundException):
        gone.create_snapshot()
    print("snapshots ok")
finally:
    for s in made:
        s.kill()
    sbx.kill()
