"""minisbert as an installed package (pyproject.toml).

"Correct" means: the package's dependencies are requirements.txt's (the four runtime packages, and
pytest as the `test` extra), so that the README's setup and `pip install .` install the same things;
and a copy installed by pip holds every module of minisbert/, imports from any folder, and, having no
clone around it, keeps weights, data and its cache under ~/.cache/minisbert instead of beside itself.
And the house keeps its shape: folders by job, no two modules of one name, no import circle, and the
plain rooms (the network, the plain search loop and its checks, what every job shares) import nothing
from a fast/ room, so a student can read them without the speed machinery. Sizes are read, not
asserted here: a line count met by joining lines would measure nothing.
"""

import ast
import os
import re
import shutil
import subprocess
import sys

import pytest

from .conftest import REPO


def requirement_lines(text: str) -> list:
    return sorted(line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip())


def test_the_package_depends_on_what_requirements_txt_lists():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert sorted(project["dependencies"] + project["optional-dependencies"]["test"]) == \
        requirement_lines((REPO / "requirements.txt").read_text())
    assert project["optional-dependencies"]["test"] == ["pytest>=7"]


def test_an_installed_copy_holds_every_module_and_imports_from_anywhere(tmp_path):
    pytest.importorskip("setuptools", reason="building the package without network access needs setuptools")
    source, target = tmp_path / "source", tmp_path / "site"  # built from a copy: setuptools writes build/ beside it
    shutil.copytree(REPO / "minisbert", source / "minisbert", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True, capture_output=True, cwd=tmp_path,
                   env={**os.environ, "PIP_NO_INDEX": "1"})
    modules = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "minisbert").rglob("*.py"))
    assert sorted(p.relative_to(target).as_posix() for p in (target / "minisbert").rglob("*.py")) == modules
    show = ("import minisbert, minisbert.experiments.runner, minisbert.encoding.fast.tiled_encoder, minisbert.datasets.beir\n"
            "from minisbert.common.fileio import home_folder\n"
            "print(minisbert.__file__); print(home_folder('weights')); print(home_folder('.cache'))")
    finished = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True, cwd=tmp_path, check=True,
                              env={**os.environ, "PYTHONPATH": str(target), "XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert finished.stdout.split() == [str(target / "minisbert" / "__init__.py"), str(tmp_path / "xdg" / "minisbert" /
                                       "weights"), str(tmp_path / "xdg" / "minisbert" / "cache")]


def test_in_the_clone_weights_data_and_cache_are_the_clone_s_own():
    from minisbert.common.fileio import home_folder

    assert [home_folder(name) for name in ("weights", "data", ".cache")] == [REPO / "weights", REPO / "data",
                                                                              REPO / ".cache"]


# The plain rooms: the network, the plain search loop and what it reads, and what every job shares.
PLAIN_ROOMS = ("minisbert.encoding", "minisbert.search.plain", "minisbert.search.inputs", "minisbert.search.bounds",
               "minisbert.common")
# The modules that offer the choice of path import a fast room on purpose, when it is asked for.
CHOOSERS = ("minisbert.encoding.backend",)


def module_imports() -> dict:
    """Each module of minisbert/ (dotted name) -> the modules of minisbert/ it imports, at any depth of
    its code (an import inside a function still ties the two rooms)."""
    paths = {".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): path
             for path in (REPO / "minisbert").rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package[: len(package) - node.level + 1] + [node.module or ""]).strip(".") \
                    if node.level else node.module
                submodules = {f"{base}.{alias.name}" for alias in node.names} & paths.keys()
                imported.update(submodules or {base})
        graph[name] = {module for module in imported if module in paths} - {name}
    return graph


def fast_room(module: str) -> bool:
    return "fast" in module.split(".")


def test_the_package_is_folders_by_job_each_saying_what_it_holds():
    top = sorted(path.name for path in (REPO / "minisbert").iterdir() if path.name != "__pycache__")
    folders = [name for name in top if (REPO / "minisbert" / name).is_dir()]
    assert top == sorted(folders + ["__init__.py"]), top
    assert {"encoding", "training", "search", "evaluation"} <= set(folders)
    for folder in (REPO / "minisbert").rglob("*/"):
        if folder.name == "__pycache__":
            continue
        docstring = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
        assert docstring and docstring.splitlines()[0].endswith((".", ":")), folder


def test_no_two_modules_share_a_name():
    names = [path.name for path in (REPO / "minisbert").rglob("*.py") if path.name not in ("__init__.py", "__main__.py")]
    assert sorted({name for name in names if names.count(name) > 1}) == []


def test_the_plain_rooms_import_nothing_from_fast():
    graph = module_imports()
    for module in graph:
        if module.startswith(PLAIN_ROOMS) and not fast_room(module) and module not in CHOOSERS:
            reached, waiting = set(), [module]
            while waiting:
                name = waiting.pop()
                if name not in reached and name not in CHOOSERS:
                    reached.add(name)
                    waiting += graph.get(name, ())
            assert not [name for name in reached if fast_room(name)], module


def test_no_module_imports_itself_through_others():
    graph, state = module_imports(), {}

    def circle_from(module, path):
        state[module] = "open"
        for imported in sorted(graph[module]):
            if state.get(imported) == "open":
                return path + [imported]
            if imported not in state and (found := circle_from(imported, path + [imported])):
                return found
        state[module] = "done"
        return None

    circles = [found for module in sorted(graph) if module not in state and (found := circle_from(module, [module]))]
    assert not circles


def test_the_readmes_reading_order_states_its_files_sizes_truly():
    """The README's reading order says how long each file and the whole path is (so that a reader can
    plan the afternoon); those numbers are the files' line counts now, each within a tenth (a file
    edited since keeps its count roughly true; one that doubled makes the sentence false here)."""
    section = (REPO / "README.md").read_text(encoding="utf-8").split("## Reading order", 1)[1].split("\n## ", 1)[0]
    stated = {path: int(count) for path, count in re.findall(r"`([\w/]+\.py)` \((\d+)", section)}
    assert len(stated) == 17, stated
    for path, count in stated.items():
        lines = len((REPO / path).read_text(encoding="utf-8").splitlines())
        assert abs(lines - count) <= count / 10, f"README says {path} has {count} lines; it has {lines}"
    total = int(re.search(r"about ([\d,]+) lines \(the line counts", section).group(1).replace(",", ""))
    assert abs(sum(stated.values()) - total) <= total / 10, (sum(stated.values()), total)


def test_every_environment_variable_the_package_reads_is_in_the_readmes_table():
    """A variable read out of a reader's sight is a setting nobody knows of: each one the package reads
    (os.environ with a literal name, or a MINISBERT_ name kept in a constant) has its row in README.md's
    table, which says why it exists; and the table names none that the package does not read."""
    read = set()
    for path in (REPO / "minisbert").rglob("*.py"):
        source = path.read_text()
        read.update(re.findall(r"os\.environ(?:\.get)?[\[(]['\"]([A-Z_]+)['\"]", source))  # os.environ["NAME"]
        read.update(re.findall(r"['\"](MINISBERT_[A-Z_]+)['\"]", source))  # NAME_VARIABLE = "MINISBERT_..."
        for names in re.findall(r"for name in \(([^)]*)\):\n\s+if name not in os\.environ", source):  # a loop
            read.update(re.findall(r"['\"]([A-Z_]+)['\"]", names))
    section = (REPO / "README.md").read_text(encoding="utf-8").split("## Settings: environment variables", 1)[1]
    table = set(re.findall(r"`([A-Z][A-Z_]+)`", section.split("\n## ", 1)[0]))
    assert read == table, (sorted(read - table), sorted(table - read))
