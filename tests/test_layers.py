"""The architecture of DESIGN §1, checked on the source: the engine imports nothing of warden
outside itself, and the control plane (server, store, executors) never imports the simulator.
What both shells share lives in the engine (`warden.engine.accounting`). Imports under
`TYPE_CHECKING` count too: a type-only dependency is still one. Within the server, and within
the engine, no module imports another that imports it back, however indirectly: each can be
read, and loaded, on its own terms."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

WARDEN = Path(__file__).resolve().parents[1] / "warden"


def imported(path: Path) -> set[str]:
    """Every module a file of the package imports."""
    parts = path.relative_to(WARDEN.parent).with_suffix("").parts
    package = ".".join(parts if path.name == "__init__.py" else parts[:-1])
    return imports_of(path.read_text(), package, str(path))


def imports_of(source: str, package: str, filename: str = "<source>") -> set[str]:
    """Every module `source` imports, relative imports resolved against `package`."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)  # `from warden import sim`
    return out


def modules(*packages: str) -> list[Path]:
    return sorted(p for pkg in packages for p in (WARDEN / pkg).rglob("*.py"))


def _is(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def module_name(path: Path) -> str:
    parts = path.relative_to(WARDEN.parent).with_suffix("").parts
    return ".".join(parts[:-1] if path.name == "__init__.py" else parts)


def import_graph(*packages: str) -> dict[str, set[str]]:
    """For each module of `packages`, the modules of `packages` it imports: at the top, inside a
    function or under `TYPE_CHECKING` alike."""
    paths = {module_name(p): p for p in modules(*packages)}
    return {name: {m for m in imported(path) if m in paths and m != name} for name, path in paths.items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph`, its modules in import order and the first repeated last;
    None when there is none."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for target in sorted(graph.get(node, ())):
            found = visit(target, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    for node in sorted(graph):
        found = visit(node, [])
        if found:
            return found
    return None


@pytest.mark.parametrize("path", modules("server", "store", "executors"), ids=lambda p: str(p.relative_to(WARDEN)))
def test_the_control_plane_does_not_import_the_simulator(path: Path) -> None:
    assert not {m for m in imported(path) if _is(m, "warden.sim")}


@pytest.mark.parametrize("path", modules("engine"), ids=lambda p: str(p.relative_to(WARDEN)))
def test_the_engine_imports_nothing_of_warden_but_itself(path: Path) -> None:
    outside = {m for m in imported(path) if _is(m, "warden") and not _is(m, "warden.engine")}
    assert not outside


@pytest.mark.parametrize("package", ["server", "engine"])
def test_the_modules_of_a_package_import_each_other_in_no_cycle(package: str) -> None:
    """A cycle dodged by a function-local or a `TYPE_CHECKING` import is still a cycle."""
    found = cycle(import_graph(package))
    assert found is None, " -> ".join(found or ())


def test_the_checks_see_imports_of_every_form() -> None:
    """Absolute, `from` and relative imports are all seen (else the checks above prove nothing)."""
    source = "import warden.sim.metrics\nfrom warden import sim\nfrom ..sim.records import SimRun\n"
    found = imports_of(source, "warden.server")
    assert {"warden.sim.metrics", "warden.sim", "warden.sim.records"} <= found
    assert imports_of("from . import rules\n", "warden.engine") >= {"warden.engine", "warden.engine.rules"}


def test_the_cycle_check_sees_type_only_and_local_imports() -> None:
    """Imports under `TYPE_CHECKING` and inside functions are edges, and a cycle through them is
    found (else the cycle check above proves nothing)."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from warden.server.b import B\n"
        "def f():\n"
        "    from warden.server import c\n"
    )
    assert {"warden.server.b", "warden.server.c"} <= imports_of(source, "warden.server")
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


DUTY_MODULES = {
    "apply", "cancels", "charging", "context", "engineguard", "exits", "nodes", "preempt", "recovery", "timelimits",
}  # fmt: skip
LOOP_DUTIES = sorted(p for p in modules("server") if p.stem in DUTY_MODULES)


@pytest.mark.parametrize("path", LOOP_DUTIES, ids=lambda p: str(p.relative_to(WARDEN)))
def test_the_reconcile_loops_duties_never_import_the_loop(path: Path) -> None:
    """`Reconciler` hands each duty the shared context; a duty that reached back into the loop
    would make the two one module again."""
    assert not {m for m in imported(path) if _is(m, "warden.server.reconcile")}


def test_every_duty_of_the_reconcile_loop_is_checked() -> None:
    assert len(LOOP_DUTIES) == 10


def state_writes(source: str, filename: str = "<source>") -> list[str]:
    """Where `source` changes a job's state other than through the lifecycle: a `replace` with
    `state=`, an assignment to a `.state` attribute, a store `transition` that names no `event`,
    or a jobs-table write (`.values(state=...)`) outside the store's own transition."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            keywords = {k.arg for k in node.keywords}
            if name == "replace" and "state" in keywords:
                found.append((node.lineno, "replace(..., state=...)"))
            elif name == "transition" and "event" not in keywords:
                found.append((node.lineno, "transition(...) without event="))
            elif name == "values" and "state" in keywords:
                found.append((node.lineno, ".values(state=...)"))
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr == "state" and _a_job(t.value) for t in targets):
                found.append((node.lineno, ".state = ..."))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def _a_job(value: ast.expr) -> bool:
    """`job.state = …`, `pod.job.state = …`: the receiver is named for a job."""
    name = value.attr if isinstance(value, ast.Attribute) else getattr(value, "id", "")
    return "job" in name


# The lifecycle itself, and the one store method that carries a checked transition out.
LIFECYCLE_HOMES = {"engine/lifecycle.py", "store/jobs.py"}


@pytest.mark.parametrize("path", modules("."), ids=lambda p: str(p.relative_to(WARDEN)))
def test_no_module_changes_a_jobs_state_but_through_the_lifecycle(path: Path) -> None:
    if str(path.relative_to(WARDEN)) in LIFECYCLE_HOMES:
        return
    assert not state_writes(path.read_text(), str(path))


def test_the_state_write_check_sees_every_form() -> None:
    source = """
from dataclasses import replace
a = replace(job, state=JobState.RUNNING)
store.transition(1, JobState.PENDING, reason="x")
conn.execute(update(JOBS).values(state="PENDING"))
pod.job.state = JobState.FAILED
ok = replace(job, claim=True)
store.transition(1, JobState.PENDING, event=Event.REQUEUED, reason="x")
self.state = 3
"""
    assert [w.split(":")[0] for w in state_writes(source)] == ["line 3", "line 4", "line 5", "line 6"]
