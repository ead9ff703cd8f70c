"""The bench's acceptance report: /metrics deltas as the seed's table, settled scrapes, the spec-log check."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from openinfer.benchmarks import acceptance
from openinfer.benchmarks.acceptance import AcceptanceReport, MetricsSnapshot, check_spec_logs, scrape_settled
from openinfer.tools.spec_tally import AcceptanceTally, tally_metrics


def exposition(engine: str, drafts: int, per_pos: list[int], hist: list[int] | None) -> str:
    """One engine's spec-decode series as a server exports them (hist None: vLLM, which has no histogram nor
    the per-position verified, reached and unverified counts; openinfer's say here that every draft was
    verified whole, without confidences)."""
    labels = f'engine="{engine}",model_name="m"'
    accepted = sum(per_pos)
    lines = [
        f"vllm:spec_decode_num_drafts_total{{{labels}}} {drafts}.0",
        f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {drafts * len(per_pos)}.0",
        f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {accepted}.0",
    ]
    lines += [
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} {n}.0'
        for i, n in enumerate(per_pos)
    ]
    lines += [
        f'openinfer:spec_decode_accepted_length_total{{accepted="{a}",{labels}}} {n}.0'
        for a, n in enumerate(hist or [])
    ]
    if hist is not None:
        lines += [
            f'openinfer:spec_decode_num_draft_tokens_per_pos_total{{{labels},position="{i}"}} {drafts}.0'
            for i in range(len(per_pos))
        ]
        lines.append(f"openinfer:spec_decode_num_unverified_draft_tokens_total{{{labels}}} 0.0")
        reached = [drafts, *per_pos[:-1]]  # verified whole: position i is reached when i - 1 was accepted
        lines += [
            f'openinfer:spec_decode_num_reached_per_pos_total{{{labels},position="{i}"}} {n}.0'
            for i, n in enumerate(reached)
        ]
        lines += [
            f'openinfer:spec_decode_confidence_micros_per_pos_total{{{labels},position="{i}"}} 0.0'
            for i in range(len(per_pos))
        ]
    return "\n".join(lines) + "\n"


def snapshot(text: str, started: float = 0.0, finished: float = 0.0) -> MetricsSnapshot:
    engines = tally_metrics(text)
    return MetricsSnapshot(engines, any(t.hist for t in engines.values()), started, finished, True)


def row(table: str, label: str) -> str:
    """The cells of one row of a printed table, with runs of spaces squeezed to one."""
    line = next(line for line in table.splitlines() if line.startswith(label + "  "))
    return re.sub(r"\s{2,}", " | ", line.removeprefix(label).strip())


def test_table_is_the_deltas_summed_and_per_engine() -> None:
    """Engine 0 moved from 2 to 6 drafts, engine 1 appeared with 4: the table shows the deltas, K=3."""
    before = exposition("0", 2, [1, 1, 0], [1, 0, 1, 0])
    after = exposition("0", 6, [4, 2, 1], [2, 2, 1, 1]) + exposition("1", 4, [2, 0, 0], [2, 2, 0, 0])
    table = AcceptanceReport(snapshot(before), snapshot(after)).format()
    assert table.splitlines()[0].split() == ["all", "engines", "engine", "0", "engine", "1"]
    assert row(table, "rounds (drafts)") == "8 | 4 | 4"
    assert row(table, "draft tokens") == "24 | 12 | 12"  # 3 per draft here
    assert row(table, "accepted tokens") == "7 | 5 | 2"  # sum of per_pos deltas: (3+1+1), (2)
    assert row(table, "mean accepted draft") == "0.875 | 1.250 | 0.500"
    assert row(table, "mean acceptance length") == "1.875 | 2.250 | 1.500"
    assert row(table, "acceptance rate") == "29.2% | 41.7% | 16.7%"
    assert row(table, "zero-accept") == "37.5% | 25.0% | 50.0%"
    assert row(table, "full-K (K=3)") == "12.5% | 25.0% | 0.0%"
    assert [row(table, f"hist[{n}]") for n in range(4)] == [
        "3 | 1 | 2",
        "4 | 2 | 2",
        "0 | 0 | 0",
        "1 | 1 | 0",
    ]
    assert row(table, "per-position rate[0]") == "0.625 (5) | 0.750 (3) | 0.500 (2)"


def test_vllm_server_without_histogram_says_not_available() -> None:
    """Against vLLM (per-position series only) the histogram rows say n/a; the rest is computed."""
    before = exposition("0", 0, [0, 0, 0], None)
    after = exposition("0", 10, [6, 4, 2], None)
    report = AcceptanceReport(snapshot(before), snapshot(after))
    table = report.format()
    assert not report.after.has_histogram
    assert row(table, "rounds (drafts)") == "10 | 10"
    assert row(table, "mean acceptance length") == "2.200 | 2.200"  # 1 + 12 accepted / 10 drafts
    assert row(table, "zero-accept") == "n/a | n/a"
    assert row(table, "full-K (K=3)") == "n/a | n/a"
    assert [row(table, f"hist[{n}]") for n in range(4)] == ["n/a | n/a"] * 4
    assert row(table, "per-position rate[2]") == "0.200 (2) | 0.200 (2)"
    assert report.to_json()["zero_accept_rate"] is None


def test_no_spec_counters_says_so() -> None:
    """A server without a drafter exports no spec-decode series: the report says there are none."""
    assert "no speculative-decoding counters" in AcceptanceReport(snapshot(""), snapshot("")).format()


def test_scrape_settles_when_two_scrapes_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scrapes repeat until two in a row agree; the first of the pair is the snapshot's time."""
    texts = [
        exposition("0", 1, [0], [1, 0]),
        exposition("0", 3, [1], [2, 1]),
        exposition("0", 3, [1], [2, 1]),
    ]
    monkeypatch.setattr(acceptance, "SETTLE_INTERVAL_S", 0.01)
    monkeypatch.setattr(acceptance, "scrape_metrics", lambda url: texts.pop(0))
    settled = scrape_settled("http://unused/metrics")
    assert settled.settled and settled.engines[0].num_drafts == 3 and not texts
    assert settled.started <= settled.finished


def test_scrape_gives_up_on_counters_that_keep_moving(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counters still moving at the timeout: the latest scrape, marked unsettled (and the table warns)."""
    drafts = iter(range(1, 1000))
    monkeypatch.setattr(acceptance, "SETTLE_INTERVAL_S", 0.01)
    monkeypatch.setattr(acceptance, "scrape_metrics", lambda url: exposition("0", next(drafts), [0], [1, 0]))
    moving = scrape_settled("http://unused/metrics", timeout=0.05)
    assert not moving.settled
    assert "other traffic" in AcceptanceReport(moving, moving).format()


def log_line(time: float, engine: int, accepted: int) -> str:
    return json.dumps({
        "time": time, "engine_index": engine, "incarnation": "00000000000000ab", "request_id": "r",
        "num_spec_tokens": 2, "num_draft_tokens": 2, "num_accepted": accepted,
    })  # fmt: skip


def test_spec_logs_count_only_drafts_within_the_run(tmp_path: Path) -> None:
    """Lines timed before the first scrape or after the last are another run's; the rest equals the deltas."""
    (tmp_path / "spec-engine0.jsonl").write_text(
        "\n".join([log_line(5.0, 0, 2), log_line(10.0, 0, 1), log_line(11.0, 0, 0), log_line(20.0, 0, 2)])
    )
    before = snapshot(exposition("0", 1, [1, 1], [0, 0, 1]), started=9.0)
    after = snapshot(exposition("0", 3, [2, 1], [1, 1, 1]), finished=12.0)  # + one 1-accept, one 0-accept
    check = check_spec_logs(AcceptanceReport(before, after), tmp_path)
    assert check.agree, check.format()
    assert "1 file(s)" in check.format() and "2 drafts within the run" in check.format()

    wrong = snapshot(exposition("0", 3, [1, 0], [2, 1, 0]), finished=12.0)
    check = check_spec_logs(AcceptanceReport(before, wrong), tmp_path)
    assert not check.agree
    assert "engine 0: hist[2]: metrics -1, logs 0" in check.format()


def test_spec_logs_folder_must_exist(tmp_path: Path) -> None:
    """--spec-logs naming no folder is an error that says what to give."""
    report = AcceptanceReport(snapshot(""), snapshot(""))
    with pytest.raises(ValueError, match="not a folder"):
        check_spec_logs(report, tmp_path / "missing")
    assert check_spec_logs(report, tmp_path).agree  # an empty folder and no drafts: nothing differs


def test_report_json_has_summed_and_per_engine_tallies() -> None:
    """--json carries the summed tally, each engine's and the derived rates."""
    after = exposition("0", 2, [1, 0], [1, 1, 0]) + exposition("1", 2, [2, 1], [0, 1, 1])
    report = AcceptanceReport(snapshot(""), snapshot(after)).to_json()
    assert (
        report["all"] == AcceptanceTally(4, 8, 4, [3, 1], [1, 2, 1], 2, [4, 4], 0, [4, 3], [0, 0]).to_json()
    )
    assert report["acceptance_rate"] == 4 / 8 and report["per_pos_rates"] == [0.75, 0.25]
    assert set(report["engines"]) == {"0", "1"}  # type: ignore[arg-type]
