"""The shipped Prometheus rules and Grafana dashboard: valid, and about series that exist."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from shardq.bin.metrics import families
from shardq.core.instruments import REGISTRY
from shardq.outbox import instruments  # noqa: F401 - registers the relay's series
from shardq.shards.config import ShardMap

from ..support import ROOT

DEPLOY = ROOT / "deploy"


def exported_names() -> set[str]:
    """Every series name the exporter and the daemons can produce."""
    names = {f.name for f in families(ShardMap.from_urls(["postgresql://h/db"]), {})}
    for family in REGISTRY.collect():
        names |= {family.name, f"{family.name}_total", f"{family.name}_bucket",
                  f"{family.name}_sum", f"{family.name}_count"}
    return names


def referenced(expression: str) -> set[str]:
    return set(re.findall(r"\bshardq_[a-z_]+", expression))


def test_alerts_and_dashboard_name_only_series_that_exist() -> None:
    # Read without a YAML parser (none is a dependency); promtool parses it below.
    rules = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    exprs = re.findall(r"^\s+expr: (.+)$", rules, re.MULTILINE)
    dashboard = json.loads((DEPLOY / "grafana" / "shardq-dashboard.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    unknown = set().union(*map(referenced, exprs)) - exported_names()
    assert unknown == set()
    assert set(re.findall(r"- alert: (\w+)", rules)) == {
        "ShardqShardDown", "ShardqStaleWaits", "ShardqOverdueTasks", "ShardqOutboxBacklogAge",
        "ShardqOutboxPermanentFailures"}


def test_promtool_checks_and_unit_tests_the_rules() -> None:
    if shutil.which("promtool") is None:
        missing = "promtool is not installed (Debian: apt-get install prometheus)"
        # .ci/run installs it: in CI a skip would hide that install step going missing.
        if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
            pytest.fail(f"{missing}, and CI is set: .ci/run should have installed it")
        pytest.skip(missing)
    for args in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"]):
        done = subprocess.run(["promtool", *args], cwd=DEPLOY / "prometheus",
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
