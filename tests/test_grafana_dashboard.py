"""docs/grafana-dashboard.json queries only metrics the server exports."""

from __future__ import annotations

import json
import re

import httpx

from conftest import ROOT, ServerProcess

SUFFIXES = ("_bucket", "_total", "_count", "_sum")


def test_every_metric_the_dashboard_queries_exists(gemma_server: ServerProcess) -> None:
    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 20
    queried = {m for e in exprs for m in re.findall(r"\bllamaserve_[a-z_]+", e)}
    text = httpx.get(f"{gemma_server.url}/metrics", timeout=10).text
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    exported = families | {f + s for f in families for s in SUFFIXES}
    missing = sorted(queried - exported)
    assert not missing, missing
    # the panels the operators asked for
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Tokens per second", "Time to first token", "Inter-token latency", "KV cache use",
            "Prefix-cache hit rate", "Draft acceptance", "Errors by type"} <= titles
