"""A typed state whose leaves flatten in a fixed order.

XLA's fusion of a compiled round follows the order of its arguments' leaves, so the same state in
another leaf order can move float32 sums by an ulp. A method whose reference results were
recorded with a given order keeps it by registering its dataclass with `ordered_pytree`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

# Any nest of arrays jax.tree handles (a model's parameters, a state, a batch): for annotations.
PyTree = Any


def ordered_pytree(*order: str, parts: dict[str, type] | None = None) -> Callable[[type], type]:
    """Register a frozen dataclass as a pytree whose children are `order`: field names, or
    "field.sub" for a field of a part (`parts[field]`, a dataclass), so the leaves of different
    parts may interleave. Every field (and every field of each part it reaches) is named once."""
    parts = parts or {}

    def register(cls: type) -> type:
        named = {p.partition(".")[0] for p in order}
        assert named == {f.name for f in dataclasses.fields(cls)}, (cls, named)
        for head, part in parts.items():
            if head in named:
                subs = {p.partition(".")[2] for p in order if p.startswith(head + ".")}
                assert subs == {f.name for f in dataclasses.fields(part)}, (cls, head, subs)
        split = [p.partition(".")[::2] for p in order]
        keys = tuple(jax.tree_util.GetAttrKey(p) for p in order)

        def children(obj):
            return [getattr(getattr(obj, h), s) if s else getattr(obj, h) for h, s in split]

        def unflatten(_, leaves):
            fields: dict[str, Any] = {}
            subs: dict[str, dict] = {}
            for (h, s), leaf in zip(split, leaves, strict=True):
                if s:
                    subs.setdefault(h, {})[s] = leaf
                else:
                    fields[h] = leaf
            return cls(**fields, **{h: parts[h](**kw) for h, kw in subs.items()})

        jax.tree_util.register_pytree_with_keys(
            cls,
            lambda obj: (list(zip(keys, children(obj), strict=True)), None),
            unflatten,
            lambda obj: (children(obj), None),
        )
        return cls

    return register
