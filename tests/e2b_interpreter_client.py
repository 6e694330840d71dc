"""`e2b_code_interpreter` user code, unchanged: run by tests/test_e2b.py in
a venv with the pinned package, against Warren's E2B listeners and a
template (`code-interpreter-v1`, the SDK's default) whose sandboxes start
the interpreter's server."""

from e2b.exceptions import TimeoutException
from e2b_code_interpreter import Sandbox

sbx = Sandbox.create()
try:
    ex = sbx.run_code("x = 1 + 1; x")
    assert ex.text == "2", ex
    ex = sbx.run_code("print('a')")
    assert ex.logs.stdout == ["a\n"], ex
    ex = sbx.run_code("1 / 0")
    assert ex.error and ex.error.name == "ZeroDivisionError", ex
    ctx = sbx.create_code_context()
    assert ctx.id in [c.id for c in sbx.list_code_contexts()]
    sbx.run_code("y = 5", context=ctx)
    assert sbx.run_code("y", context=ctx).text == "5"
    assert sbx.run_code("'y' in globals()").text == "False"
    try:
        sbx.run_code("import time; time.sleep(5)", timeout=1)
        raise AssertionError("a 1 s timeout did not fire")
    except TimeoutException:
        pass
    # envd works beside the interpreter, as in E2B's own template.
    assert sbx.commands.run("echo envd").stdout == "envd\n"
finally:
    sbx.kill()
print("interpreter ok")
