"""promtool on every file of deploy/prometheus: configs, rules, and the rules' unit tests (counter resets,
engines of different K, idle windows, each alert's timing)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.deploy.stack import PROMETHEUS_DIR, require_tools

CONFIGS = sorted(PROMETHEUS_DIR.glob("*.yml"))
RULES = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
RULE_TESTS = sorted((PROMETHEUS_DIR / "tests").glob("*_test.yml"))


def promtool(*args: str | Path, cwd: Path = PROMETHEUS_DIR) -> None:
    require_tools("promtool")
    result = subprocess.run(
        ["promtool", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_file_is_checked() -> None:
    """The host, fleet and federation configs, recording (host and fleet) and alerting rules, and a test file
    for each rule file exist."""
    assert [p.name for p in CONFIGS] == ["federation.yml", "fleet.yml", "prometheus.yml"]
    assert [p.name for p in RULES] == [
        "openinfer-alerts.yml",
        "openinfer-fleet.yml",
        "openinfer-recording.yml",
    ]
    assert [p.name for p in RULE_TESTS] == [f"{p.stem}_test.yml" for p in RULES]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_check_config(config: Path) -> None:
    """`promtool check config` (which checks the rule files a config names, too)."""
    promtool("check", "config", config)


@pytest.mark.parametrize("rules", RULES, ids=lambda p: p.name)
def test_check_rules(rules: Path) -> None:
    promtool("check", "rules", rules)


@pytest.mark.parametrize("tests", RULE_TESTS, ids=lambda p: p.name)
def test_rules_unit_tests(tests: Path) -> None:
    """`promtool test rules`: exact recorded values over hand-counted drafts."""
    promtool("test", "rules", tests.name, cwd=tests.parent)
