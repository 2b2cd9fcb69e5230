"""One /metrics scrape, parsed into samples by name and labels."""

import socket

from prometheus_client.parser import text_string_to_metric_families

DEFAULT_INSTANCE = f"{socket.gethostname()}:8080"  # the demo config's port


async def scrape(http, instance: str = DEFAULT_INSTANCE) -> dict[str, float]:
    """{sample name + sorted labels: value} of one /metrics scrape; every sample must carry the
    label instance=`instance` (left out of the keys)."""
    resp = await http.get("/metrics")
    assert resp.status == 200 and resp.content_type == "text/plain"
    samples = {}
    for family in text_string_to_metric_families(await resp.text()):
        for s in family.samples:
            assert s.labels.get("instance") == instance, s
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k not in ("le", "instance"))
            key = f"{s.name}{{{labels}}}" if labels else s.name
            if "le" in s.labels:
                key += f"@{s.labels['le']}"
            samples[key] = s.value
    return samples
