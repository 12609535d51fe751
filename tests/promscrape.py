"""Scraping a Prometheus endpoint as Prometheus does (GET /metrics over HTTP), read with
prometheus_client's own parser: shared by the unit tests of each service's endpoint and the
closed loop's system test."""

from __future__ import annotations

import ssl
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str, *, token: str | None = None, ca_file: str | None = None) -> Samples:
    """Every sample the endpoint at `url` serves, by its name and labels."""
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    with urllib.request.urlopen(request, timeout=10, context=context) as reply:
        text = reply.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; KeyError naming it (and what the endpoint has) when absent."""
    key = (name, frozenset(labels.items()))
    if key not in samples:
        known = sorted({n for n, _ in samples})
        raise KeyError(f"{name}{labels or ''} not scraped; the endpoint has {known}")
    return samples[key]
