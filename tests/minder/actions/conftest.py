"""Fixtures of the scheduler-action tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from slurm_cluster import SlurmCluster, skip_reason

from minder.stream import EmbeddedBroker


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A real one-host Slurm cluster (munged, slurmctld, one slurmd per node) for the session.

    Nodes ``demo-n0023``, ``demo-n0024``, ``demo-n0025``, all ``IDLE`` at the start; a test that
    drains one returns it with ``slurm_cluster.reset(node)``. Skips when Slurm or MUNGE is not
    installed (``.ci/install-slurm.sh``) or the tests do not run as root.
    """
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with SlurmCluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    """A real Kafka-protocol broker (Tansu) for the end-to-end tests of one module."""
    with EmbeddedBroker() as running:
        yield running
