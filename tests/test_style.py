"""The project's style rule "Type hints on public functions", checked on the source's AST."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parents[1] / "src"
PACKAGES = ("fedjax_semi", "hydra_plugins")
SPECIAL = ("__call__", "__init__")  # public although they start with "_"
Function = ast.FunctionDef | ast.AsyncFunctionDef


def _missing(fn: Function) -> bool:
    """Whether `fn` lacks an annotation on an argument (self and cls excepted) or its return
    (`__init__` excepted)."""
    if fn.name.startswith("_") and fn.name not in SPECIAL:
        return False
    a = fn.args
    named = [x for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
    star = [x for x in (a.vararg, a.kwarg) if x is not None]
    if any(x.annotation is None for x in named + star):
        return True
    return fn.returns is None and fn.name != "__init__"


def _offenders(path: Path) -> list[str]:
    """file:line name of each public function (module level) or method (of a public module-level
    class) of one file that lacks a type hint."""
    found = []
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, Function) and _missing(node):
            found.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name}")
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for sub in node.body:
                if isinstance(sub, Function) and _missing(sub):
                    found.append(f"{path.relative_to(SRC)}:{sub.lineno} {node.name}.{sub.name}")
    return found


def test_public_functions_have_type_hints() -> None:
    files = sorted(p for pkg in PACKAGES for p in (SRC / pkg).rglob("*.py"))
    assert files, f"no sources under {SRC}"
    offenders = [o for p in files for o in _offenders(p)]
    assert not offenders, (
        f"{len(offenders)} public functions lack a type hint (an argument's or the return's):\n"
        + "\n".join(offenders)
    )
