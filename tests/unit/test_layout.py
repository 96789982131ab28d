"""The house plan: wings import one way (cli → training → data → engines → checkpoint
→ models → core), no module takes part in an import circle, and the package installs with its
console scripts and configuration."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "raydp_llm"
# each wing may import only those before it
WINGS = ["core", "models", "checkpoint", "engines", "data", "training", "cli"]
ENTRY_POINTS = ["train", "prepare", "evaluate", "generate", "export"]


def imports_of(path: Path) -> set[str]:
    """The ``raydp_llm.*`` names a file imports, at any depth (function-level imports too): the
    module of ``from a.b import c``, and ``a.b.c`` beside it (``c`` may be a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("raydp_llm.")}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Each module of the package → the modules its import statements run: the one named, and
    every package above it (importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        runs = set()
        for imported in imports_of(path):
            parts = imported.split(".")
            runs.update(".".join(parts[:i]) for i in range(2, len(parts) + 1))
        graph[name] = {m for m in runs if m in modules and m != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm): each is
    an import circle."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_search_finds_a_circle_through_a_package():
    # a submodule importing its sibling runs the package's __init__, which imports it back
    graph = {"p": {"p.a"}, "p.a": {"p", "p.b"}, "p.b": set(), "q": {"p.b"}}
    assert circles(graph) == [["p", "p.a"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_takes_part_in_an_import_circle():
    assert circles(import_graph()) == []


def wing_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in WINGS else None


def test_every_module_sits_in_a_wing_or_is_an_entry_point():
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "evaluate.py", "export.py", "generate.py", "node.py",
                     "prepare.py", "train.py"]
    for entry in loose[1:]:
        door = f"raydp_llm.cli.{entry[:-3]}"
        assert imports_of(PACKAGE / entry) == {door, f"{door}.cli"}, entry
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(WINGS)


def test_imports_run_one_way():
    upward = []
    for path in sorted(PACKAGE.glob("*/**/*.py")):  # nested packages too (data/etl/)
        wing = path.relative_to(PACKAGE).parts[0]
        if wing not in WINGS:
            continue
        for module in imports_of(path):
            target = wing_of(module)
            if target and WINGS.index(target) > WINGS.index(wing):
                upward.append(f"{path.relative_to(ROOT)} imports {module}")
    assert upward == []


def defined_names(path: Path) -> set[str]:
    """The names a module's top level binds: its functions, classes, assignments, imports."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def test_every_import_of_the_package_names_what_is_there():
    """Lazy imports too (a job's modules load only when it runs): each ``from raydp_llm.a import
    b`` names a module, and ``b`` is a module under it or a name it defines."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    packages = {m for m, p in modules.items() if p.name == "__init__.py"}
    namespaces = {str(p.relative_to(ROOT)).replace("/", ".") for p in PACKAGE.rglob("*")
                  if p.is_dir() and p.name != "__pycache__"}
    broken = []
    for name, path in sorted(modules.items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0
                    and (node.module or "").startswith("raydp_llm")):
                continue
            if node.module not in modules and node.module not in namespaces:
                broken.append(f"{name}: {node.module}")
                continue
            here = defined_names(modules[node.module]) if node.module in modules else set()
            broken += [f"{name}: {node.module}.{a.name}" for a in node.names
                       if f"{node.module}.{a.name}" not in modules.keys() | namespaces
                       and a.name not in here]
    assert packages and broken == []


# training/'s rooms, each may import only those before it: the shared modules (spec, handoff,
# tasks), the objectives, the worker's code, the driver's
ROOMS = ["shared", "objectives", "worker", "driver"]


def room_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["raydp_llm", "training"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in ROOMS else "shared"


def test_training_imports_run_from_the_driver_to_the_workers_to_the_objectives():
    upward = []
    for path in sorted((PACKAGE / "training").rglob("*.py")):
        room = room_of(module_name(path))
        for module in imports_of(path):
            target = room_of(module)
            if target and ROOMS.index(target) > ROOMS.index(room):
                upward.append(f"{path.relative_to(ROOT)} imports {module}")
    assert upward == []
    assert room_of("raydp_llm.training.worker.loop") == "worker"
    assert room_of("raydp_llm.training.spec") == "shared"


# data/'s rooms (issue 68): inputs/ a module per input kind (files, query, table), and a package
# per record format. A format imports no other format's room but chat's (its template and encoder,
# which preference pairs and prompts build on); chat and the inputs import no format's.
FORMATS = ["chat", "preference", "prompts"]


def data_room_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["raydp_llm", "data"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in [*FORMATS, "inputs"] else None


def test_each_record_format_and_input_kind_keeps_to_its_room():
    crossing = []
    for path in sorted((PACKAGE / "data").rglob("*.py")):
        room = data_room_of(module_name(path))
        for module in imports_of(path) if room else ():
            target = data_room_of(module)
            allowed = {room} | ({"chat", "inputs"} if room in ("preference", "prompts") else set())
            if room in FORMATS and target == "inputs":
                continue  # a format reads its rows through an input kind's module
            if target and target not in allowed:
                crossing.append(f"{path.relative_to(ROOT)} imports {module}")
    assert crossing == []
    assert data_room_of("raydp_llm.data.prompts.encode") == "prompts"
    assert data_room_of("raydp_llm.data.etl.run") is None


# The modules whose steps (mapInArrow's functions and classes) Spark's executors unpickle: each
# executor's Python worker imports them, and Ray with RayDP would cost it 0.7 s of CPU more.
EXECUTOR_MODULES = [
    "data.inputs.arrow_reader", "data.jsonl", "data.chat.template", "data.prompts.parts",
    "data.etl.scan", "data.etl.tokenizer", "data.etl.encode", "data.chat.encode",
    "data.preference.encode", "data.etl.chunks", "data.etl.mixture_sample",
    "data.etl.curation.documents", "data.etl.curation.curate", "data.etl.curation.contamination",
]


def heavy_imports(modules: list[str]) -> str:
    """Which of Ray, RayDP and torch a fresh interpreter has imported once it imported
    ``modules`` (of raydp_llm)."""
    imports = "; ".join(f"import raydp_llm.{m}" for m in modules)
    heavy = "{'ray', 'raydp', 'torch'}"
    probe = f"import sys; {imports}; print(sorted({heavy} & sys.modules.keys()))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_the_executors_code_imports_neither_ray_nor_raydp():
    assert heavy_imports(EXECUTOR_MODULES) == "[]"


def test_the_entry_points_doors_load_neither_torch_nor_ray():
    """--help and bad input answer in a second or two: the jobs behind the doors load the rest."""
    assert heavy_imports([f"cli.{m}" for m in ENTRY_POINTS]) == "[]"


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_point_answers_help(entry):
    """Its console script's --help (``python -m``'s: test_config.py): its own usage line, its own
    name throughout (it said ``python -m ...``), its own examples (prepare's and evaluate's were
    train's)."""
    script = Path(sys.executable).with_name(f"raydp-llm-{entry}")
    done = subprocess.run([str(script), "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "model_dir" in done.stdout or "data.path" in done.stdout
    lines = done.stdout.splitlines()
    assert lines[0].startswith((f"raydp-llm-{entry} ", f"usage: raydp-llm-{entry} ")), lines[0]
    assert "python -m raydp_llm." not in done.stdout
    if entry != "train":
        assert "raydp-llm-train" not in done.stdout
    if "Examples:" in done.stdout:
        examples = done.stdout[done.stdout.index("Examples:"):].splitlines()[1:]
        assert examples[0].startswith(f"  raydp-llm-{entry} "), examples
    if entry == "evaluate":  # its own settings first (they were on lines 202-207 of 213)
        assert lines[2:4] == ["== raydp_llm.evaluate's own settings ==",
                              "  model_dir=null  # the model/ directory of a finished run "
                              "(required)"], lines[:5]


def test_the_wheel_holds_the_console_scripts_and_the_configuration(tmp_path):
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
               str(tmp_path), str(ROOT)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = tmp_path.glob("raydp_llm-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = z.read(entry_points).decode()
    for script, target in [("raydp-llm-train", "raydp_llm.cli.train:cli"),
                           ("raydp-llm-prepare", "raydp_llm.cli.prepare:cli"),
                           ("raydp-llm-evaluate", "raydp_llm.cli.evaluate:cli"),
                           ("raydp-llm-generate", "raydp_llm.cli.generate:cli"),
                           ("raydp-llm-export", "raydp_llm.cli.export:cli")]:
        assert f"{script} = {target}" in scripts
    confs = sorted(n.split(".data/data/")[1] for n in names if ".data/data/" in n)
    shipped = sorted(f"share/raydp_llm/conf/{p.relative_to(ROOT / 'conf')}"
                     for p in (ROOT / "conf").rglob("*.yaml"))
    assert confs == shipped
    assert "raydp_llm/training/driver/fit.py" in names and "raydp_llm/data/etl/__init__.py" in names
    assert "raydp_llm/log4j2.properties" in names  # the Spark driver's log configuration
