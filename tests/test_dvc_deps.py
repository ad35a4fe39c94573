"""dvc.yaml's code deps are derived from the import graph (docs/dvc_deps.py), never kept by hand:
the shipped files equal a fresh derivation, a planted import makes the check name its stage, and
the derivation follows module-level and function-level imports, packages and cycles."""

from __future__ import annotations

import importlib.util
import shutil
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("docs_dvc_deps", REPO / "docs" / "dvc_deps.py")
deps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(deps)

DVC_FILES = ("dvc.yaml", "profiles/realdata/dvc.yaml", "reports/dvc.yaml")


@pytest.mark.parametrize("name", DVC_FILES)
def test_code_deps_equal_the_derived_ones(name):
    stale = deps.process(REPO / name, REPO, write=False)
    assert stale == [], f"{name}: stale code deps in {stale}: run `python docs/dvc_deps.py {name}`"


def test_the_stages_run_what_they_name():
    commands = deps.command_modules(REPO)
    ppo = deps.derived(REPO, "rlhf ppo --out x", commands)
    assert {"pipeline/ppo", "pipeline/decode", "cli/ppo.py", "store/rollouts.py"} <= set(ppo)
    # the world stage never loads a judge: cli/common.py's loader names it, world's code does not
    assert "pipeline/models/judges.py" not in deps.derived(REPO, "rlhf world generate", commands)


def _copy_code(tmp: Path) -> Path:
    for top in ("pipeline", "cli", "store"):
        shutil.copytree(REPO / top, tmp / top, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "dvc.yaml", tmp / "dvc.yaml")
    return tmp


def test_planted_import_names_its_stage_and_rewrite_fixes_it(tmp_path):
    root = _copy_code(tmp_path)
    assert deps.process(root / "dvc.yaml", root, write=False) == []
    # route's cli module now imports the export stage's module (which no stage lists yet)
    route = root / "cli" / "route.py"
    route.write_text(route.read_text() + "\nfrom rlhf.pipeline import export  # noqa\n")
    assert deps.process(root / "dvc.yaml", root, write=False) == ["route"]
    assert deps.main(["--check", "--root", str(root), str(root / "dvc.yaml")]) == 1
    assert deps.main(["--root", str(root), str(root / "dvc.yaml")]) == 0
    assert deps.process(root / "dvc.yaml", root, write=False) == []
    text = (root / "dvc.yaml").read_text()
    route_block = text.split("\n  route:\n", 1)[1].split("\n  ppo:\n", 1)[0]
    assert "- pipeline/export.py" in route_block
    # the data deps and their comments are as written
    for line in (REPO / "dvc.yaml").read_text().splitlines():
        if line.strip().startswith(("- artifacts/", "- ../shared/", "#")):
            assert line in text.splitlines()


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, body in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(body))
    return root


@pytest.fixture
def tiny(tmp_path):
    """A tiny rlhf tree: cli/app.py registers two commands over a small pipeline package."""
    return _tree(tmp_path, {
        "cli/__init__.py": "",
        "cli/app.py": """
            from rlhf.cli import one as one_cmd
            from rlhf.cli.two import two_app
            app.command("one")(one_cmd.one)
            app.command("other")(one_cmd.other)
            app.add_typer(two_app, name="two")
        """,
        "cli/one.py": "from rlhf.pipeline.a import f\n"            # module-level
                      "def one():\n    g()\n"
                      "def g():\n    import rlhf.store.io\n"       # reached through one()
                      "def other():\n    import rlhf.pipeline.unused\n",  # another command's
        "cli/two.py": "def two_app():\n    import rlhf.pipeline.pkg.inner\n",  # function-level
        "pipeline/__init__.py": "",
        "pipeline/a.py": "from . import b\nSECTION = 'other'\n",  # relative, cycle a <-> b
        "pipeline/b.py": "from rlhf.pipeline import a\n",
        "pipeline/unused.py": "",
        "pipeline/pkg/__init__.py": "from rlhf.pipeline.pkg import helper\n",
        "pipeline/pkg/helper.py": "from typing import TYPE_CHECKING\n"
                                  "if TYPE_CHECKING:\n    from rlhf.pipeline import unused\n",
        "pipeline/pkg/inner.py": "",
        "store/__init__.py": "",
        "store/io.py": "",
    })


def test_commands_map_to_their_cli_modules(tiny):
    assert deps.command_modules(tiny) == {"one": (tiny / "cli/one.py", {"one"}),
                                          "other": (tiny / "cli/one.py", {"other"}),
                                          "two": (tiny / "cli/two.py", set())}


def test_module_level_import_relative_import_and_a_cycle(tiny):
    files = deps.closure(tiny, [tiny / "cli/one.py"], {"one"}, frozenset({"other"}))
    # one() calls g(), whose import counts; the `other` command's function is no part of it
    assert sorted(p.relative_to(tiny).as_posix() for p in files) == [
        "cli/__init__.py", "cli/one.py", "pipeline/__init__.py", "pipeline/a.py", "pipeline/b.py",
        "store/__init__.py", "store/io.py"]
    everything = deps.closure(tiny, [tiny / "cli/one.py"])  # no entry: every function runs
    assert tiny / "pipeline/unused.py" in everything


def test_function_level_import_of_a_package_module_runs_its_init(tiny):
    files = deps.closure(tiny, [tiny / "cli/two.py"], {"two_app"})
    # pkg/__init__.py imports helper; TYPE_CHECKING imports never run, so unused.py stays out
    assert deps.covering(tiny, files) == [
        "cli/__init__.py", "cli/two.py", "pipeline/__init__.py", "pipeline/pkg"]


def test_rewrite_keeps_data_deps_and_comments(tiny):
    (tiny / "dvc.yaml").write_text(textwrap.dedent("""\
        stages:
          s:
            cmd: rlhf one --x artifacts/x
            deps:
              - artifacts/x  # the input
              # why a.py
              - pipeline/a.py  # kept
              - pipeline/unused.py
              - ../shared/y
            outs:
              - artifacts/out
        """))
    assert deps.process(tiny / "dvc.yaml", tiny, write=True) == ["s"]
    assert (tiny / "dvc.yaml").read_text() == textwrap.dedent("""\
        stages:
          s:
            cmd: rlhf one --x artifacts/x
            deps:
              - artifacts/x  # the input
              - cli/__init__.py
              - cli/one.py
              - pipeline/__init__.py
              # why a.py
              - pipeline/a.py  # kept
              - pipeline/b.py
              - store/__init__.py
              - store/io.py
              - ../shared/y
            outs:
              - artifacts/out
        """)
    assert deps.process(tiny / "dvc.yaml", tiny, write=False) == []
