"""Benchmarks report a table, JSON and a PNG chart of the same rows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))

from report import Chart, report


def test_report_writes_json_and_a_chart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("BENCH_OUT", str(tmp_path))
    rows: list[dict[str, object]] = [
        {"concurrency": 1, "llamaserve tok/s": 77.1, "llama-server tok/s": 66.0},
        {"concurrency": 16, "llamaserve tok/s": 210.4, "llama-server tok/s": 193.2}]
    report(rows, "demo", Chart("concurrency", ["llamaserve tok/s", "llama-server tok/s"],
                               "tokens/s", "demo"))
    assert json.loads((tmp_path / "demo.json").read_text()) == rows
    png = (tmp_path / "demo.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    out = capsys.readouterr().out
    assert "llamaserve tok/s" in out and "210.4" in out
