"""Scraping a server's ``/metrics`` in tests, parsed with prometheus_client's own parser."""

from __future__ import annotations

from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class Scrape:
    """One ``/metrics`` answer: its families' types and every sample."""

    types: dict[str, str] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)

    def value(self, name: str, **labels: str) -> float | None:
        """The sample ``name`` whose labels include ``labels`` (None: there is none)."""
        found = [s.value for s in self.samples if s.name == name and _has(s, labels)]
        assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
        return found[0] if found else None

    def with_label(self, label: str, value: str) -> list[Sample]:
        return [s for s in self.samples if s.labels.get(label) == value]


def _has(sample: Sample, labels: dict[str, str]) -> bool:
    return all(sample.labels.get(k) == v for k, v in labels.items())


async def scrape(base_url: str) -> Scrape:
    async with (
        aiohttp.ClientSession() as http,
        http.get(base_url.rstrip("/") + "/metrics") as response,
    ):
        assert response.status == 200
        assert response.headers["Content-Type"] == CONTENT_TYPE
        text = await response.text()
    out = Scrape()
    for family in text_string_to_metric_families(text):
        out.types[family.name] = family.type
        out.samples.extend(family.samples)
    return out


def check_conventions(found: Scrape) -> None:
    """Prometheus's naming rules, as docs/metrics.md states them for every segtxn server."""
    for name, kind in found.types.items():
        assert name.startswith("segtxn_"), name
        assert not name.endswith("_count") or kind in ("histogram", "summary"), name
        assert "_bytes_bytes" not in name and "_seconds_seconds" not in name, name
    for sample in found.samples:
        assert not any(k.startswith("otel_") for k in sample.labels), sample
        assert sample.name != "target_info", sample
    assert found.types, "no families at all"
