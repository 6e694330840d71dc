"""E2B template builds with the real SDK, unchanged: run by tests/test_e2b.py
with a venv's python (a pinned `e2b`) and E2B_API_URL, E2B_SANDBOX_URL and
E2B_API_KEY pointing at Warren. argv: the base image, the context directory.
Every step asserts; a failure exits non-zero with its traceback."""

import sys
import uuid

from e2b import Sandbox, Template, wait_for_port
from e2b.exceptions import BuildException

BASE, CONTEXT = sys.argv[1], sys.argv[2]
ALIAS = f"tpl-{uuid.uuid4().hex[:8]}"


def step(name):
    print(f"step: {name}", flush=True)


step("build")
template = (
    Template(file_context_path=CONTEXT)
    .from_image(BASE)
    .copy("app/", "/app/")
    .run_cmd("echo built-as-$(id -u) > /built.txt", user="root")
    .set_envs({"GREETING": "hello $literal"})
    .set_workdir("/app")
    .set_start_cmd("python3 -m http.server 8000", wait_for_port(8000))
)
logs = []
info = Template.build(template, alias=ALIAS, cpu_count=1, memory_mb=512, on_build_logs=logs.append)
messages = [e.message for e in logs]
assert info.alias == ALIAS and info.template_id, info
assert any("COPY" in m for m in messages) and any("python3 -m http.server" not in m for m in messages), messages
assert Template.exists(ALIAS) and not Template.exists(f"{ALIAS}-nope")

step("sandbox of the template")
sbx = Sandbox.create(ALIAS, timeout=60)
try:
    r = sbx.commands.run(
        "cat /built.txt; cat main.py; echo \"$GREETING\"; pwd; "
        "python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8000/main.py').read().decode().strip())\""
    )
    assert r.stdout.split("\n")[:5] == ["built-as-0", "print('app')", "hello $literal", "/app", "print('app')"], r.stdout
finally:
    sbx.kill()

step("rebuild from the cache")
logs.clear()
again = Template.build(template, alias=ALIAS, on_build_logs=logs.append)
assert again.template_id == info.template_id
cached = sum(1 for e in logs if e.message == "CACHED")
steps = sum(1 for e in logs if e.message.startswith("["))
assert steps == 5 and cached == steps, [e.message for e in logs]

step("a template on a template")
child = Template().from_template(ALIAS).run_cmd("echo child > /child.txt", user="root")
Template.build(child, alias=f"{ALIAS}-child")
sbx = Sandbox.create(f"{ALIAS}-child", timeout=60)
try:
    assert sbx.commands.run("cat /child.txt /built.txt").stdout == "child\nbuilt-as-0\n"
finally:
    sbx.kill()

step("a failing step")
bad = Template().from_image(BASE).run_cmd("echo about to fail; exit 3")
try:
    Template.build(bad, alias=f"{ALIAS}-bad")
except BuildException as e:
    assert "exited with code 3" in str(e), e
else:
    raise AssertionError("the failing build succeeded")
assert not Template.exists(f"{ALIAS}-bad")
print("ok", flush=True)
