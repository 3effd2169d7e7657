"""Scheme name -> builder. Every name in :data:`~.knobs.SCHEMES` has one; a new scheme adds a
module with a ``build(SchemeInput) -> SchemeOutput`` and a row here (and its name there)."""

from __future__ import annotations

from fedjax_semi.data.partitions import ada, cfsl, cofed, dofed, label_skew, natural
from fedjax_semi.data.partitions.common import Builder

__all__ = ["BUILDERS"]

BUILDERS: dict[str, Builder] = {
    "iid": label_skew.build,
    "dirichlet": label_skew.build,
    "shards": label_skew.build,
    "natural": natural.build,
    "subset": dofed.build,
    "normal": dofed.build,
    "cofed": cofed.build,
    "cfsl": cfsl.build,
    "ada": ada.build,
}
