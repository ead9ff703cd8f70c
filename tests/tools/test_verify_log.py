"""openinfer-verify-log: /metrics against spec logs, bin by bin, per engine and summed (variable verify lengths,
rounds verifying nothing and a confidence head's ratings included)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from openinfer.frontend.metrics.frontend_metrics import FrontendMetrics
from openinfer.protocol import LoadSnapshot, SpecDecodeCounters
from openinfer.tools.spec_tally import AcceptanceTally, SpecLogTally, read_spec_logs
from openinfer.tools.verify_log import main

ADMIN_KEY = "verify-log-admin-key"

# (engine, K, num_draft_tokens V, num_accepted, num_proposed_tokens P) per round: engine 0 with K=3 (a draft
# trimmed from 3 to 2 tokens, and a round of 2 proposed that verified none: no draft), engine 1 with K=2.
DRAFTS = [
    (0, 3, 3, 3, 3), (0, 3, 3, 0, 3), (0, 3, 2, 1, 3), (0, 3, 3, 1, 3), (0, 3, 0, 0, 2),
    (1, 2, 2, 2, 2), (1, 2, 1, 0, 1),
]  # fmt: skip
# Engine 0's drafter rates its verified drafts (a confidence head), by index in DRAFTS; engine 1's does not.
CONFIDENCE = {0: [0.9, 0.8, 0.7], 1: [0.4, 0.3, 0.2], 2: [0.95, 0.5], 3: [0.61, 0.25, 0.125]}


def metrics_text() -> str:
    """The /metrics of a frontend that saw each engine's hello (zero counters), then all of DRAFTS."""
    metrics = FrontendMetrics()
    for engine, k in ((0, 3), (1, 2)):
        counters = SpecDecodeCounters.zero(k)
        metrics.observe_load(engine, 1, "tiny", LoadSnapshot(0, 8, 0, 0, counters.copy()))
        for i, (e, _, verified, accepted, proposed) in enumerate(DRAFTS):
            if e == engine and verified:
                counters.observe_draft(verified, accepted, proposed - verified, CONFIDENCE.get(i))
            elif e == engine:
                counters.observe_unverified(proposed)
        metrics.observe_load(engine, 1, "tiny", LoadSnapshot(0, 8, 0, 0, counters))
    return metrics.render().decode()


def log_line(
    i: int,
    engine: int,
    k: int,
    num_draft_tokens: int,
    num_accepted: int,
    num_proposed_tokens: int | None = None,
    seq: int = 0,
    confidence_micros: list[int] | None = None,
) -> str:
    """One engine spec-log line, as ``openinfer-engine --spec-log`` writes it (carried by message ``seq``);
    without ``num_proposed_tokens`` or ``confidence_micros`` as a release before it wrote them."""
    line = {
        "time": 1.0 + i, "engine_index": engine, "incarnation": "00000000000000ab", "request_id": f"r{i}",
        "num_spec_tokens": k, "num_draft_tokens": num_draft_tokens, "num_accepted": num_accepted, "seq": seq,
    }  # fmt: skip
    if num_proposed_tokens is not None:
        line["num_proposed_tokens"] = num_proposed_tokens
    if confidence_micros is not None:
        line["confidence_micros"] = confidence_micros
    return json.dumps(line)


def micros(i: int) -> list[int] | None:
    """DRAFTS[i]'s confidences as its spec-log line holds them."""
    return [round(c * 1e6) for c in CONFIDENCE[i]] if i in CONFIDENCE else None


def spec_log(path: Path, extra: str = "") -> Path:
    # seqs 1..7, after the hello
    lines = [log_line(i, *draft, seq=i + 1, confidence_micros=micros(i)) for i, draft in enumerate(DRAFTS)]
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


class _Served:
    """A /metrics text (and an /admin/engines body) served over HTTP from a thread, changeable between
    requests."""

    text = ""
    admin: dict[str, object] = {}


@pytest.fixture
def served() -> Iterator[tuple[_Served, str]]:
    served = _Served()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/admin/engines":
                if self.headers.get("Authorization") != f"Bearer {ADMIN_KEY}":
                    self.send_error(401)
                    return
                body = json.dumps(served.admin).encode()
            else:
                body = served.text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()


def run(*args: str) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    return int(exit_info.value.code or 0)


def test_equal_exits_0_and_prints_the_table(
    served: tuple[_Served, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The frontend's exact deltas equal the logs: exit 0, one column per table, the JSON report written."""
    server, url = served
    server.text = metrics_text()
    report = tmp_path / "report.json"
    assert (
        run("--metrics-url", url, "--spec-log", str(spec_log(tmp_path / "e.jsonl")), "--json", str(report))
        == 0
    )
    out = capsys.readouterr().out
    table = out.split("\n\n")[0].splitlines()  # engine 0: 4 drafts, 11 draft tokens, 5 accepted
    assert table[:9] == [
        "engine 0                 metrics = logs",
        "rounds (drafts)          4",
        "draft tokens             11",
        "accepted tokens          5",
        "mean accepted draft      1.250",
        "mean acceptance length   2.250",
        "acceptance rate          45.5%",
        "zero-accept              25.0%",
        "full-K (K=3)             25.0%",
    ]
    # Verified per position: drafts of 3, 3, 2 and 3 tokens -> [4, 4, 3]; unverified: 1 trimmed + 2 of the
    # round that verified none.
    assert table[9:] == [
        "hist[0]                  1",
        "hist[1]                  2",
        "hist[2]                  0",
        "hist[3]                  1",
        "per-position rate[0]     0.750 (3)",
        "per-position rate[1]     0.250 (1)",
        "per-position rate[2]     0.250 (1)",
        "unverified draft tokens  3",
        "conditional rate[0]      0.750 (3/4)",
        "conditional rate[1]      0.250 (1/4)",
        "conditional rate[2]      0.333 (1/3)",
        # reached: (3, 3) all, (3, 0) token 0, (2, 1) and (3, 1) tokens 0 and 1 -> [4, 3, 1]; confidences
        # summed there: .9 + .4 + .95 + .61, .8 + .5 + .25, .7
        "calibration[0]           confidence 0.715, accepted 0.750 (2860000/1e6, 3 of 4 reached)",
        "calibration[1]           confidence 0.517, accepted 0.333 (1550000/1e6, 1 of 3 reached)",
        "calibration[2]           confidence 0.700, accepted 1.000 (700000/1e6, 1 of 1 reached)",
    ]
    assert "engine 1" in out and "all engines" in out
    assert "OK: /metrics equals the spec logs bin by bin (6 drafts, 2 engine(s))" in out
    written = json.loads(report.read_text())
    assert written["equal"] is True and written["sections"]["all"]["logs"]["num_drafts"] == 6
    assert written["sections"]["all"]["logs"]["draft_tokens_per_pos"] == [6, 5, 3]
    assert written["sections"]["all"]["logs"]["num_unverified_draft_tokens"] == 3
    assert written["sections"]["all"]["logs"]["reached_per_pos"] == [6, 4, 1]  # engine 1's add [2, 1]
    assert written["sections"]["all"]["logs"]["confidence_micros_per_pos"] == [2_860_000, 1_550_000, 700_000]


def test_one_bin_difference_exits_1_naming_it(
    served: tuple[_Served, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One histogram bin off by one in /metrics: exit 1, that bin named per engine and summed, rows marked."""
    server, url = served
    bin_1 = 'openinfer:spec_decode_accepted_length_total{accepted="1",engine="0",model_name="tiny"} 2.0'
    assert bin_1 in metrics_text()
    server.text = metrics_text().replace(bin_1, bin_1.replace("2.0", "3.0"))
    assert run("--metrics-url", url, "--spec-log", str(spec_log(tmp_path / "e.jsonl"))) == 1
    out = capsys.readouterr().out
    differs = [line for line in out.splitlines() if line.startswith("differs:")]
    assert differs == [
        "differs: engine 0: hist[1]: metrics 3, logs 2",
        "differs: all engines: hist[1]: metrics 3, logs 2",
    ]
    assert "engine 0                 metrics         logs" in out
    assert "hist[1]                  3               2   <-- differs" in out


@pytest.mark.parametrize(
    ("sample", "bin_name"),
    [
        ('openinfer:spec_decode_num_draft_tokens_per_pos_total{engine="0",model_name="tiny",position="2"} 3.0',
         "draft_per_pos[2]"),
        ('openinfer:spec_decode_num_unverified_draft_tokens_total{engine="0",model_name="tiny"} 3.0',
         "unverified_tokens"),
        ('openinfer:spec_decode_num_reached_per_pos_total{engine="0",model_name="tiny",position="1"} 3.0',
         "reached_per_pos[1]"),
        ('openinfer:spec_decode_confidence_micros_per_pos_total{engine="0",model_name="tiny",position="2"} '
         "700000.0", "confidence_micros_per_pos[2]"),
    ],
)  # fmt: skip
def test_a_verify_length_bin_difference_exits_1(
    served: tuple[_Served, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    sample: str,
    bin_name: str,
) -> None:
    """A verified or reached per-position count, the unverified count or a confidence sum off by one in
    /metrics: exit 1, that bin named."""
    server, url = served
    assert sample in metrics_text()
    name, value = sample.rsplit(" ", 1)
    count = round(float(value))
    server.text = metrics_text().replace(sample, f"{name} {count + 1}.0")
    assert run("--metrics-url", url, "--spec-log", str(spec_log(tmp_path / "e.jsonl"))) == 1
    differs = [line for line in capsys.readouterr().out.splitlines() if line.startswith("differs:")]
    engine_1 = {"reached_per_pos[1]": 1}.get(bin_name, 0)  # engine 1's share of the summed bin
    assert differs == [
        f"differs: engine 0: {bin_name}: metrics {count + 1}, logs {count}",
        f"differs: all engines: {bin_name}: metrics {count + 1 + engine_1}, logs {count + engine_1}",
    ]


def test_malformed_log_lines_fail(
    served: tuple[_Served, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Lines that are not JSON, miss a field or describe an impossible round (more accepted than verified,
    more verified than proposed, a round proposing nothing) are reported; exit 1."""
    server, url = served
    server.text = metrics_text()
    bad = 'not json\n{"engine_index": 0}\n[1, 2]\n' + log_line(9, 0, 3, 2, 3) + "\n"  # 3 accepted of 2
    bad += log_line(10, 0, 3, 2, 1, 1) + "\n" + log_line(11, 0, 3, 0, 0, 0) + "\n"
    log = spec_log(tmp_path / "e.jsonl", extra=bad)
    assert run("--metrics-url", url, "--spec-log", str(log)) == 1
    reported = [line for line in capsys.readouterr().out.splitlines() if line.startswith("not a draft:")]
    assert [line.split(": ")[1] for line in reported] == [f"{log}:{n}" for n in (8, 9, 10, 11, 12, 13)]
    assert "missing required field `time`" in reported[1] and "3 accepted of 2" in reported[3]
    assert "2 tokens verified of 1 proposed" in reported[4] and "0 tokens verified of 0" in reported[5]


def test_io_and_usage_errors_exit_2(served: tuple[_Served, str], tmp_path: Path) -> None:
    """A missing log file, an unreachable /metrics, or no --spec-log at all: exit 2."""
    server, url = served
    server.text = metrics_text()
    assert run("--metrics-url", url, "--spec-log", str(tmp_path / "missing.jsonl")) == 2
    log = str(spec_log(tmp_path / "e.jsonl"))
    assert run("--metrics-url", "http://127.0.0.1:1/metrics", "--spec-log", log) == 2
    assert run("--metrics-url", url) == 2


def test_tallies_add_and_subtract_bin_by_bin() -> None:
    """Log tallies count prefix per-position and histogram bins; minus() gives the counts between scrapes."""
    logs = SpecLogTally()
    for i, draft in enumerate(DRAFTS):
        logs.add_line(log_line(i, *draft), f"line {i + 1}")
    assert logs.engines[1] == AcceptanceTally(2, 3, 2, [1, 1], [1, 0, 1], 2, [2, 1], 0, [2, 1], [0, 0])
    assert logs.engines[0] == AcceptanceTally(
        4, 11, 5, [3, 1, 1], [1, 2, 0, 1], 3, [4, 4, 3], 3, [4, 3, 1], [0, 0, 0]
    )  # fmt: skip  (no confidences in these lines)
    later = AcceptanceTally(5, 14, 8, [4, 2, 2], [1, 2, 0, 2], 3, [5, 5, 4], 5, [5, 4, 2], [900, 800, 700])
    assert later.minus(logs.engines[0]) == AcceptanceTally(
        1, 3, 3, [1, 1, 1], [0, 0, 0, 1], 3, [1, 1, 1], 2, [1, 1, 1], [900, 800, 700]
    )


def test_unsent_tail_and_earlier_drafts_are_reported_apart(
    served: tuple[_Served, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With --engines-url, lines past the last seq the frontend counted (an engine killed before sending
    them) and lines in its first snapshot are tallied apart: /metrics equals the counted lines, exit 0."""
    server, url = served
    server.text = metrics_text()
    engine_0 = {"incarnation": "00000000000000ab", "after_seq": None, "through_seq": 7}
    engine_1 = {"incarnation": "00000000000000ab", "after_seq": 0, "through_seq": 9}
    server.admin = {"engines": [], "counted_seqs": {"0": [engine_0], "1": [engine_1]}}
    tail = "".join(log_line(10 + i, 0, 3, 3, 3, seq=8) + "\n" for i in range(2))  # never sent
    earlier = log_line(12, 1, 2, 2, 1, seq=0) + "\n"  # in the hello this frontend took for a baseline
    log = str(spec_log(tmp_path / "e.jsonl", extra=tail + earlier))
    engines_url = url.replace("/metrics", "/admin/engines")
    report = tmp_path / "report.json"
    args = ("--metrics-url", url, "--spec-log", log, "--engines-url", engines_url, "--json", str(report))
    monkeypatch.setenv("OPENINFER_ADMIN_API_KEY", ADMIN_KEY)
    assert run(*args) == 0
    out = capsys.readouterr().out
    assert "OK: /metrics equals the spec logs bin by bin (6 drafts, 2 engine(s))" in out
    assert "unsent tail: engine 0: 2 drafts whose snapshot never reached this frontend" in out
    assert "earlier: engine 1: 1 drafts in the first snapshot this frontend saw" in out
    written = json.loads(report.read_text())
    assert (written["unsent"]["0"]["num_drafts"], written["earlier"]["1"]["num_drafts"]) == (2, 1)
    assert run("--metrics-url", url, "--spec-log", log) == 1  # without it, the tail counts as a difference
    monkeypatch.setenv("OPENINFER_ADMIN_API_KEY", "wrong")
    assert run(*args) == 2


def test_a_line_cut_by_a_kill_is_reported_apart(tmp_path: Path) -> None:
    """A line that is not JSON, right before another incarnation's lines or last in a file without its
    newline, was cut by a kill: reported in ``cut``; one that is JSON but no draft, or is followed by its own
    incarnation's lines, stays malformed."""
    restarted = json.dumps({**json.loads(log_line(1, 0, 3, 3, 1)), "incarnation": "00000000000000cd"})
    first = tmp_path / "first.jsonl"  # incarnation ab cut, then cd; a bad line inside ab's lines
    first.write_text(log_line(0, 0, 3, 3, 3) + '\n{"time": 2\n' + log_line(1, 0, 3, 3, 1) + '\n{"time": 3, "eng\n'
                     + restarted + "\n")  # fmt: skip
    last = tmp_path / "last.jsonl"  # cut last, no newline; and a JSON non-draft last with its newline
    last.write_text(log_line(0, 1, 2, 2, 2) + '\n{"time": 4, "en')
    json_last = tmp_path / "json_last.jsonl"
    json_last.write_text(log_line(0, 1, 2, 2, 2) + '\n{"time": 5}\n')
    logs = read_spec_logs([first, last, json_last])
    assert [where.split(": ")[0] for where in logs.cut] == [f"{first}:4", f"{last}:2"]
    assert [where.split(": ")[0] for where in logs.malformed] == [f"{first}:2", f"{json_last}:2"]
    assert (logs.engines[0].num_drafts, logs.engines[1].num_drafts) == (3, 2)
