"""The source tree's shape: no crate's top-level modules depend on each
other in a cycle (scripts/module-cycles.py says how a dependency is read)."""

import subprocess
import sys

import pytest

from conftest import ROOT, UP_ARGS

# No daemon here: the suite's second pass (another node transport) would
# only run the same thing again.
pytestmark = pytest.mark.skipif(bool(UP_ARGS), reason="no daemon; run once")

SCRIPT = ROOT / "scripts" / "module-cycles.py"


def test_no_crate_has_a_module_cycle():
    run = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"module cycles:\n{run.stdout}{run.stderr}"


def test_the_script_finds_a_cycle_and_ignores_comments_and_strings(tmp_path):
    src = tmp_path / "crates" / "demo" / "src"
    (src / "b").mkdir(parents=True)
    (src / "lib.rs").write_text("mod a;\nmod b;\nmod c;\n")
    (src / "a.rs").write_text("use crate::{b::x, c};\n")
    # A submodule counts toward its top-level module; `super::super` from
    # an inline module inside b/y.rs reaches the crate root.
    (src / "b" / "y.rs").write_text("mod t { fn f() { super::super::super::a::g() } }\n")
    (src / "b.rs").write_text("mod y;\n")
    (src / "c.rs").write_text(
        '// crate::a\nconst S: &str = "crate::a";\nconst R: &str = r#"super::a"#;\n'
        "/* crate::a /* nested */ crate::a */ fn f<'a>(c: char) -> bool { c == '\"' }\n"
    )
    run = subprocess.run(
        [sys.executable, SCRIPT, "--crates", tmp_path / "crates"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    # c names a only in a comment, a string and a raw string: no edge.
    assert run.stdout.splitlines()[0] == "demo: cycle a <-> b", run.stdout
