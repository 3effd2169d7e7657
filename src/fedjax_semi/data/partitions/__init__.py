"""Federated partitions: which sample indices each client holds, per role.

Pure numpy and deterministic given a ``np.random.Generator``. Per-client index lists are
``list[np.ndarray]`` of sorted ``int64`` indices. :func:`build_partition` ties the pieces
together for a dataset; its indices refer to ``concat(train, test)`` (see there).

One module per scheme family, looked up by name in :data:`.registry.BUILDERS`:
:mod:`.label_skew` (iid, dirichlet, shards; UM-pFSSL is ``dirichlet`` +
``labeled_mode=dirichlet`` + ``split=pooled``), :mod:`.dofed` (DoFed-SPP's subset/normal),
:mod:`.cofed` (CoFED), :mod:`.cfsl` (CFSL) and :mod:`.ada` (Ada-FedSemi). Shared pieces:
:mod:`.container` (:class:`Partition` and its file), :mod:`.roles` (labeled split, dealing
val/test by class proportions), :mod:`.knobs` (scheme names, paper knobs),
:mod:`.transforms` (per-client label maps and rotations) and :mod:`.common`.
"""

from fedjax_semi.data.partitions.ada import dominant_class_partition
from fedjax_semi.data.partitions.build import build_partition
from fedjax_semi.data.partitions.container import Partition, PartitionFileError
from fedjax_semi.data.partitions.knobs import (
    PAPER_DEFAULTS,
    POOLED_FRACTIONS,
    SCHEME_GROUP,
    SCHEMES,
    check_knobs,
)
from fedjax_semi.data.partitions.label_skew import (
    dirichlet_partition,
    iid_partition,
    shard_partition,
)
from fedjax_semi.data.partitions.roles import (
    class_proportions,
    labeled_split,
    split_by_proportions,
)
from fedjax_semi.data.partitions.transforms import apply_client_transforms

__all__ = [
    "PAPER_DEFAULTS",
    "POOLED_FRACTIONS",
    "SCHEME_GROUP",
    "SCHEMES",
    "Partition",
    "PartitionFileError",
    "apply_client_transforms",
    "build_partition",
    "check_knobs",
    "class_proportions",
    "dirichlet_partition",
    "dominant_class_partition",
    "iid_partition",
    "labeled_split",
    "shard_partition",
    "split_by_proportions",
]
