"""The agent's Prometheus endpoint: ``/metrics`` served by ``prometheus-client`` from a
thread of its own, with the figures of `harness.inside.metrics` (the same families the
file holds; the heartbeat's age reckoned at each scrape). Needs the ``metrics`` extra."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol


class Families(Protocol):
    """The agent's figures (`harness.inside.metrics.Metrics`) as the endpoint reads them."""

    def families(self) -> Iterable[Any]:
        """Every metric family now: ``name``, ``help``, ``kind`` and ``samples``."""
        ...


class _Collector:
    """Hands the registry the agent's families at each scrape."""

    def __init__(self, metrics: Families) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        """One prometheus-client family per family of the agent."""
        from prometheus_client.metrics_core import Metric

        for fam in self.metrics.families():
            metric = Metric(fam.name, fam.help, fam.kind)
            suffix = "_total" if fam.kind == "counter" else ""
            for labels, value in fam.samples:
                metric.add_sample(fam.name + suffix, labels, value)
            yield metric


def start_endpoint(metrics: Families, address: str, port: int) -> tuple[Any, int]:
    """Serve ``metrics`` on ``address:port`` (0: a free port); the server and its port."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        raise ImportError(
            "the metrics endpoint needs prometheus-client (pip install 'tightrope[metrics]')"
        ) from None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(metrics))
    server, _thread = start_http_server(port, addr=address, registry=registry)
    return server, int(server.server_port)
