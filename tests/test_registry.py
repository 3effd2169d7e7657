"""Task variants in the method registry: `make_algorithm(name, roles=...)` builds the first
registered variant of `name` whose `applies(roles)` holds, else the method's own factory
(DoFed-SPP's FedAvg and Local baselines on its SUBSET/NORMAL tasks)."""

from __future__ import annotations

import pytest

from conftest import compose_config
from fedjax_semi import experiment
from fedjax_semi.algorithms import registry
from fedjax_semi.algorithms.dofed_fedavg import TargetTaskFedAvg
from fedjax_semi.algorithms.fedavg import FedAvgFamily

DOFED_ROLES = ("labeled", "target_labeled", "target_unlabeled", "test")
SEMI_ROLES = ("labeled", "unlabeled", "test")
SUBSET = [
    "partition=subset",
    "num_clients=6",
    "clients_per_round=3",
    "partition.dofed.train_per_class=20",
    "partition.dofed.target_per_class=20",
    "partition.dofed.target_labeled_fraction=0.5",
    "partition.dofed.test_per_class=8",
]


def test_a_variant_is_chosen_by_roles_and_the_plain_factory_otherwise(monkeypatch):
    """The first variant whose applies(roles) holds wins; without roles, or when none applies,
    the method's own factory builds it. Variants see the role names as a tuple."""
    seen = []

    def wants_target(roles):
        seen.append(roles)
        return "target_labeled" in roles

    first = lambda **kw: ("first", kw["cfg"])  # noqa: E731
    second = lambda **kw: ("second", kw["cfg"])  # noqa: E731
    plain = lambda **kw: ("plain", kw["cfg"])  # noqa: E731
    variants = [(lambda roles: False, second), (wants_target, first), (wants_target, second)]
    monkeypatch.setitem(registry._VARIANTS, "probe", variants)
    monkeypatch.setitem(registry._FACTORIES, "probe", plain)
    monkeypatch.setattr(registry, "check_config_class", lambda name, cfg: None)
    assert registry.make_algorithm("probe", roles=list(DOFED_ROLES), cfg=1) == ("first", 1)
    assert seen == [DOFED_ROLES]
    assert registry.make_algorithm("probe", roles=SEMI_ROLES, cfg=2) == ("plain", 2)
    assert seen == [DOFED_ROLES, SEMI_ROLES, SEMI_ROLES]  # every variant was asked
    assert registry.make_algorithm("probe", cfg=3) == ("plain", 3)
    assert len(seen) == 3  # no roles: no variant is asked


def test_register_variant_appends_in_order(monkeypatch):
    monkeypatch.setattr(registry, "_VARIANTS", {})

    def applies(roles):
        return True

    @registry.register_variant("probe", applies)
    def a(**kw):
        return "a"

    @registry.register_variant("probe", applies)
    def b(**kw):
        return "b"

    variants = registry._VARIANTS
    assert list(variants) == ["probe"]
    assert variants["probe"] == [(applies, a), (applies, b)]


@pytest.mark.parametrize("name", ["fedavg", "local"])
def test_dofed_tasks_build_the_target_task_baselines(name):
    """experiment.build passes the partition's roles: on DoFed-SPP's SUBSET partition fedavg and
    local are its baselines (TargetTaskFedAvg); on a semi-supervised one, the plain family."""
    plain = experiment.build(compose_config(f"algorithm={name}"))
    assert type(plain.alg) is FedAvgFamily and plain.alg.name == name
    target = experiment.build(compose_config(f"algorithm={name}", *SUBSET))
    assert tuple(target.fed.roles) == DOFED_ROLES
    assert type(target.alg) is TargetTaskFedAvg and target.alg.name == name
    assert target.alg.communicates == (name == "fedavg")


def test_the_local_variant_keeps_locals_checks():
    """algorithm=local on DoFed-SPP's task still requires shared=none."""
    with pytest.raises(Exception, match=r"algorithm\.shared.*'none'"):
        experiment.build(compose_config("algorithm=local", "algorithm.shared=all", *SUBSET))
