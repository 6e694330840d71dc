"""SandboxFusion's /run_jupyter driver, run by Warren inside the sandbox.

Reads tmp/sandbox/configs/input.json ({"kernel", "cells", "cell_timeout",
"total_timeout"}), runs the cells in order in one Python kernel, and writes
tmp/sandbox/configs/output.json ({"status", "cells"}) with each cell's
stdout, stderr, display data (mime type -> data) and errors ({"ename",
"evalue", "traceback"}), as SandboxFusion's own driver (runtime/jupyter/
main.py) does. A cell that raises does not stop the ones after it.

With jupyter_client and ipykernel in the image, the cells run in a real
Jupyter kernel (rich display such as matplotlib's image/png included).
Without them, a small kernel of this file runs them: one namespace for all
cells, the value of a cell's last expression displayed as text/plain (its
repr), output of the cell and of its child processes captured per cell.
"""

import ast
import json
import os
import signal
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
INPUT = os.path.join(HERE, "tmp/sandbox/configs/input.json")
OUTPUT = os.path.join(HERE, "tmp/sandbox/configs/output.json")


class CellTimeout(Exception):
    pass


def write_output(status, cells):
    os.makedirs(os.path.dirname(OUTPUT), exist_ok=True)
    with open(OUTPUT, "w") as f:
        json.dump({"status": status, "cells": cells}, f)


def new_cell():
    return {"stdout": "", "stderr": "", "display": [], "error": []}


def run_in_jupyter(config):
    """The cells in a real kernel, as SandboxFusion runs them."""
    import asyncio

    from jupyter_client import AsyncKernelManager

    # ipykernel's debugger otherwise warns about frozen modules on stderr
    # at every start, which would fill the driver's stderr.
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")

    async def main():
        km = AsyncKernelManager(kernel_name=config["kernel"])
        await km.start_kernel()
        kc = km.client()
        kc.start_channels()
        await kc.wait_for_ready(timeout=60)
        cells = []
        status = "Finished"
        try:
            for code in config["cells"]:
                cell = new_cell()

                def hook(msg, cell=cell):
                    kind = msg["header"]["msg_type"]
                    content = msg["content"]
                    if kind == "stream":
                        cell[content["name"]] += content["text"]
                    elif kind in ("display_data", "execute_result"):
                        cell["display"].append(content["data"])
                    elif kind == "error":
                        cell["error"].append(content)

                timeout = config["cell_timeout"] or None
                try:
                    reply = await kc.execute_interactive(code, output_hook=hook, timeout=timeout)
                    cell["status"] = reply["content"]["status"]
                except TimeoutError:
                    cells.append(cell)
                    status = "TimeLimitExceeded"
                    break
                await late_output(kc, reply["parent_header"].get("msg_id"), hook)
                cells.append(cell)
        finally:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)
        return status, cells

    return asyncio.run(main())


async def late_output(kc, msg_id, hook):
    """What the cell's child processes printed and the kernel sent after it
    said it was idle: their output reaches the kernel through a pipe that a
    thread of its own reads, so under load it can come after the reply
    (`os.system("echo ...")` then showed nothing). Taken while it keeps
    coming, for the cell that made it."""
    while True:
        try:
            msg = await kc.get_iopub_msg(timeout=0.1)
        except Exception:
            return
        if msg["parent_header"].get("msg_id") == msg_id and msg["header"]["msg_type"] == "stream":
            hook(msg)


def split_last_expression(code):
    """The cell's statements, and its last one apart when it is an
    expression (displayed, as in a notebook)."""
    tree = ast.parse(code, "<cell>", "exec")
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
        return tree, last
    return tree, None


def cell_frames(tb):
    """The traceback from the cell's own code on (not this driver's)."""
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return tb


def on_alarm(signum, frame):
    raise CellTimeout()


def run_builtin(config):
    """The cells in this process: one namespace, per-cell capture of the
    file descriptors 1 and 2 (so a child process's output lands in its
    cell too)."""
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    cells = []
    status = "Finished"
    signal.signal(signal.SIGALRM, on_alarm)
    saved = (os.dup(1), os.dup(2))
    for code in config["cells"]:
        cell = new_cell()
        out = tempfile.TemporaryFile()
        err = tempfile.TemporaryFile()
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        timed_out = False
        try:
            if config["cell_timeout"]:
                signal.setitimer(signal.ITIMER_REAL, config["cell_timeout"])
            body, last = split_last_expression(code)
            exec(compile(body, "<cell>", "exec"), namespace)
            if last is not None:
                value = eval(compile(last, "<cell>", "eval"), namespace)
                if value is not None:
                    namespace["_"] = value
                    cell["display"].append({"text/plain": repr(value)})
            cell["status"] = "ok"
        except CellTimeout:
            timed_out = True
        except BaseException as e:  # noqa: BLE001 - a cell's error is its output
            cell["status"] = "error"
            cell["error"].append({
                "ename": type(e).__name__,
                "evalue": str(e),
                "traceback": traceback.format_exception(type(e), e, cell_frames(e.__traceback__)),
            })
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
        for name, f in (("stdout", out), ("stderr", err)):
            f.seek(0)
            cell[name] = f.read().decode("utf-8", errors="replace")
            f.close()
        cells.append(cell)
        if timed_out:
            status = "TimeLimitExceeded"
            break
    return status, cells


def has_jupyter():
    try:
        import ipykernel  # noqa: F401
        import jupyter_client  # noqa: F401
    except ImportError:
        return False
    return True


def main():
    with open(INPUT) as f:
        config = json.load(f)
    config.setdefault("cell_timeout", 0)
    if has_jupyter():
        print(f"kernel: {config['kernel']} (Jupyter)", flush=True)
        status, cells = run_in_jupyter(config)
    else:
        print("kernel: Warren's built-in Python kernel (no jupyter_client/ipykernel in the image)", flush=True)
        status, cells = run_builtin(config)
    write_output(status, cells)


main()
