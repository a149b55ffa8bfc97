"""The kinds of lock node as the seam registers them (celery_redlock.core.nodes.KINDS)."""

from __future__ import annotations

import pytest

from celery_redlock.core.nodes import KINDS, check_together, check_ttl, kind_of, node_for
from celery_redlock.core.nodes.kind import Kind


@pytest.mark.parametrize("scheme", sorted(KINDS))
def test_every_scheme_names_a_kind_that_takes_it(scheme):
    kind = KINDS[scheme]()
    assert Kind in type(kind).__mro__ and scheme in kind.schemes
    assert KINDS[scheme]() is kind  # imported once


def test_a_node_finds_its_kind_by_its_kind_name():
    node = node_for("memory://kinds", 1.0)
    assert kind_of(node) is KINDS["memory"]()
    assert not kind_of(node).has_schema and KINDS["postgresql"]().has_schema


def test_the_optional_checks_default_to_accepting():
    nodes = [node_for("memory://kinds", 1.0)]
    check_ttl(nodes, 0.001)  # no minimum TTL
    check_together(nodes, ["a:{1}", "b:{2}"])  # any names together
    assert kind_of(nodes[0]).send(None, nodes, [], []) == [0]  # nothing goes unwaited
