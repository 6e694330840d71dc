"""E2B SDK user code, unchanged, against a template with E2B's user
(`user`, home /home/user): run by tests/test_e2b.py in a venv with the
pinned SDK. argv: the template."""

import sys

from e2b import Sandbox

sbx = Sandbox.create(sys.argv[1])
try:
    # Commands run as the template's user, in its home, with its login
    # environment; any user named gets its own.
    probe = "id -un; pwd; echo $HOME $USER $LOGNAME"
    out = sbx.commands.run(probe).stdout.split()
    assert out == ["user", "/home/user", "/home/user", "user", "user"], out
    out = sbx.commands.run(probe, user="root").stdout.split()
    assert out == ["root", "/root", "/root", "root", "root"], out
    # Relative paths are the user's home; what is written there is theirs.
    sbx.files.write("note.txt", "hi")
    out = sbx.commands.run("cat /home/user/note.txt; echo; stat -c %U /home/user/note.txt").stdout.split()
    assert out == ["hi", "user"], out
    info = sbx.files.get_info("note.txt")
    assert (info.path, info.owner) == ("/home/user/note.txt", "user"), info
    sbx.commands.run("echo more >> note.txt")
    assert sbx.files.read("note.txt") == "himore\n"
    print("user ok")
finally:
    sbx.kill()
