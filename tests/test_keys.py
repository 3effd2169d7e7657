"""Random-stream purposes are declared once, in engine.keys, and are distinct."""

from __future__ import annotations

import ast
from pathlib import Path

import jax
import numpy as np

import fedjax_semi
from fedjax_semi.engine import keys

SRC = Path(fedjax_semi.__file__).parent
KEY_FUNCS = {"client_key", "round_key"}


def test_purposes_are_distinct_integers_except_declared_aliases():
    assert len(keys.PURPOSES) >= 30
    assert all(type(v) is int and v >= 0 for v in keys.PURPOSES.values())
    for alias, target in keys.ALIASES.items():
        assert keys.PURPOSES[alias] == keys.PURPOSES[target], alias
    by_value: dict[int, list[str]] = {}
    for name, value in keys.PURPOSES.items():
        if name not in keys.ALIASES:
            by_value.setdefault(value, []).append(name)
    shared = {v: names for v, names in by_value.items() if len(names) > 1}
    assert not shared, f"purposes sharing a value (declare them in keys.ALIASES): {shared}"


def test_client_key_is_a_fold_in_chain():
    seed = jax.random.PRNGKey(3)
    f = jax.random.fold_in
    want = f(f(f(seed, keys.SAMPLE), 7), 11)
    np.testing.assert_array_equal(keys.client_key(seed, keys.SAMPLE, 7, 11), want)
    np.testing.assert_array_equal(keys.round_key(seed, keys.SELECT, 7), f(f(seed, keys.SELECT), 7))


def _keys_imports(tree: ast.Module) -> set[str]:
    """Local names bound by `from fedjax_semi.engine.keys import ...` (aliases included)."""
    return {
        a.asname or a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "fedjax_semi.engine.keys"
        for a in node.names
    }


def _name(func: ast.expr) -> str | None:
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)


def test_every_stream_constant_comes_from_engine_keys():
    """Every purpose passed to client_key / round_key, and every constant folded in with
    fold_in, is a name imported from engine.keys; a purpose may also be a parameter of the
    enclosing function when every call of that function, in any module, passes such a name
    there. No other module defines a constant named like a purpose."""
    bad, sites, modules = [], 0, set()
    forwarded: dict[str, set[int]] = {}  # function -> positions of its purpose parameters
    trees = {}
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "engine" / "keys.py":
            continue
        rel = path.relative_to(SRC)
        tree = ast.parse(path.read_text())
        imported = _keys_imports(tree)
        trees[rel] = (tree, imported)
        for node in tree.body:  # module-level integer constants named like a purpose
            targets = node.targets if isinstance(node, ast.Assign) else []
            value = getattr(node, "value", None)
            if isinstance(value, ast.Constant) and type(value.value) is not int:
                continue  # e.g. engine.augment.FILL = 128.0, a pixel value
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name) and n.id in keys.PURPOSES:
                        bad.append(f"{rel}:{node.lineno} defines {n.id}")
        parent = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
        for call in ast.walk(tree):
            if not isinstance(call, ast.Call):
                continue
            name = _name(call.func)
            arg = call.args[1] if name in KEY_FUNCS | {"fold_in"} else None
            if name == "fold_in" and not (isinstance(arg, ast.Name) and arg.id.isupper()):
                continue  # an index or counter within an already derived stream
            if arg is None:
                continue
            sites += 1
            modules.add(rel.as_posix())
            if isinstance(arg, ast.Name) and arg.id in imported:
                continue
            fn = parent.get(call)
            while fn is not None and not isinstance(fn, ast.FunctionDef):
                fn = parent.get(fn)
            params = [a.arg for a in fn.args.args] if fn is not None else []
            if name in KEY_FUNCS and isinstance(arg, ast.Name) and arg.id in params:
                pos = params.index(arg.id) - (params[:1] == ["self"])
                forwarded.setdefault(fn.name, set()).add(pos)
                continue
            bad.append(f"{rel}:{call.lineno} {name}(..., {ast.unparse(arg)}, ...)")
    for rel, (tree, imported) in trees.items():  # callers of functions that forward a purpose
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and _name(call.func) in forwarded):
                continue
            for pos in sorted(forwarded[_name(call.func)]):
                arg = call.args[pos] if pos < len(call.args) else None
                if not (isinstance(arg, ast.Name) and arg.id in imported):
                    shown = "nothing positional" if arg is None else ast.unparse(arg)
                    bad.append(f"{rel}:{call.lineno} passes purpose {shown}")
                sites += 1
    assert not bad, "\n".join(bad)
    # the scan saw the call sites it is meant to check
    assert sites >= 30, sites
    for m in ("fedavg", "fedbe", "fedfomo", "pfedme", "um_pfssl", "dofed_spp"):
        assert f"algorithms/{m}.py" in modules, m
    assert {"engine/clients.py", "engine/train.py", "systems/uplink.py"} <= modules
