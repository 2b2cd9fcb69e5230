"""The `instance` label that every sample of `/metrics` carries, so that a Prometheus scraping
every instance of a fleet tells them apart (docs/deploy.md).

The registry itself stays unlabelled (code that reads a sample back, e.g. the soak's books,
names it as before); the label is added when the exposition is written. Its value is
`[server] instance_id`, or by default `hostname:port` (a pod's name on Kubernetes).
"""

from __future__ import annotations

import socket

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

INSTANCE_LABEL = "instance"


def instance_id(configured: str, port: int) -> str:
    """`configured` (the setting), or this machine's name and the port served."""
    return configured or f"{socket.gethostname()}:{port}"


class InstanceLabelled:
    """A collector that yields `registry`'s metric families with the instance label added."""

    def __init__(self, registry: CollectorRegistry, instance: str):
        self._registry = registry
        self.instance = instance

    def collect(self):
        for family in self._registry.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            labelled.samples = [
                sample._replace(labels={**sample.labels, INSTANCE_LABEL: self.instance}) for sample in family.samples
            ]
            yield labelled

    def exposition(self) -> bytes:
        """The Prometheus text format of every sample, labelled."""
        return generate_latest(self)
