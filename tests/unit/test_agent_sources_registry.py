"""The agent's sources: one registry, each source enabled by its part, run in the documented order."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, cast

import gpumond.agent.sources as sources_pkg
from gpumond.agent.dcgm import DcgmCompat
from gpumond.agent.sources.parts import NodeParts, Registration
from gpumond.agent.sources.registry import REGISTERED, build

ALL_FAST = ("nvml_fast", "dcgm_compat_fast", "policy", "nvml_mig", "dcgm_compat_mig", "xid", "host")
ALL_SLOW = ("nvml_slow", "pod_resources", "dcgm_compat_slow", "jobs")


def parts(**given: Any) -> NodeParts:
    # Building a source never touches its parts; only collecting does, so a bare object stands in for each.
    return NodeParts(cast(Any, object()), hostname="n", **given)


def names(tiers) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return tuple(s.name for s in tiers.fast), tuple(s.name for s in tiers.slow)


def test_a_bare_node_has_the_nvml_sources_only():
    assert names(build(parts())) == (("nvml_fast", "nvml_mig"), ("nvml_slow",))


def test_every_part_given_enables_every_source_in_the_order_they_run():
    full = parts(xid=object(), jobs=object(), pods=object(), host=object(), policy=object(),
                 dcgm=DcgmCompat(hostname="n"))
    assert names(build(full)) == (ALL_FAST, ALL_SLOW)


def test_each_part_enables_its_own_sources_only():
    assert names(build(parts(xid=object()))) == (("nvml_fast", "nvml_mig", "xid"), ("nvml_slow",))
    assert names(build(parts(jobs=object()))) == (("nvml_fast", "nvml_mig"), ("nvml_slow", "jobs"))
    assert names(build(parts(pods=object()))) == (("nvml_fast", "nvml_mig"), ("nvml_slow", "pod_resources"))
    assert names(build(parts(dcgm=DcgmCompat(hostname="n")))) == (
        ("nvml_fast", "dcgm_compat_fast", "nvml_mig", "dcgm_compat_mig"), ("nvml_slow", "dcgm_compat_slow"))


def test_every_registration_a_source_module_declares_is_in_the_one_registry():
    declared = []
    for info in pkgutil.iter_modules(sources_pkg.__path__):
        module = importlib.import_module(f"{sources_pkg.__name__}.{info.name}")
        declared += [v for v in vars(module).values() if isinstance(v, Registration)]
    assert declared and set(map(id, declared)) == set(map(id, REGISTERED))
    assert len(REGISTERED) == len(set(map(id, REGISTERED)))
