"""The sweep's pieces: drafter specs, datasets from flags, the combined markdown table and the plot."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from openinfer.benchmarks.acceptance import AcceptanceReport, MetricsSnapshot
from openinfer.benchmarks.bench_run import BenchResult
from openinfer.benchmarks.load_report import LoadReport
from openinfer.benchmarks.local_server import Drafter, parse_drafter
from openinfer.benchmarks.plot import PlotSeries, plot_acceptance
from openinfer.benchmarks.prefix_cache import PrefixCacheCounts, PrefixCacheReport
from openinfer.benchmarks.request_client import RequestOutcome
from openinfer.benchmarks.sweep import SweepCell, markdown_table, parse_args, plot_series
from openinfer.tools.spec_tally import AcceptanceTally


def test_drafter_specs() -> None:
    """none, ngram[:K=N], dflash[:PATH][:K=N], dspark[:PATH][:K=N] (K defaults to 7), each but none with an
    optional :adaptive, as openinfer-serve flags; none says --no-spec (openinfer-serve drafts by default with
    the built-in model), dflash or dspark without a path leaves the drafter to the server (its built-in one
    on the built-in model); adaptive verification is said either way (its default depends on the method)."""
    off = "--no-enable-adaptive-verification"
    assert parse_drafter("none").serve_args() == ["--no-spec"]
    assert parse_drafter("ngram").serve_args() == ["--spec-method", "ngram", "--num-spec-tokens", "7", off]
    assert parse_drafter("ngram:K=3").num_spec_tokens == 3
    assert parse_drafter("dflash:/m/d:K=5") == Drafter("dflash:/m/d:K=5", "dflash", 5, Path("/m/d"))
    assert parse_drafter("dflash:/m/d").serve_args()[-3:] == ["--draft-model", "/m/d", off]
    assert parse_drafter("dflash:K=4").serve_args() == [
        "--spec-method",
        "dflash",
        "--num-spec-tokens",
        "4",
        off,
    ]
    assert parse_drafter("dflash") == Drafter("dflash", "dflash", 7, None)
    assert parse_drafter("dspark:/m/s:K=7:adaptive") == Drafter(
        "dspark:/m/s:K=7:adaptive", "dspark", 7, Path("/m/s"), adaptive=True
    )
    assert parse_drafter("dspark:K=7").serve_args() == [
        "--spec-method",
        "dspark",
        "--num-spec-tokens",
        "7",
        off,
    ]
    assert parse_drafter("ngram:adaptive").serve_args()[-1] == "--enable-adaptive-verification"
    for bad in (
        "eagle",
        "ngram:K=0",
        "ngram:K=x",
        "dflash:K=0",
        "dflash::K=4",
        "ngram:/p",
        "dspark::K=4",
        "none:adaptive",
    ):
        with pytest.raises(ValueError, match="use none, ngram"):
            parse_drafter(bad)


def test_dataset_paths_go_to_the_datasets_that_need_one() -> None:
    """--dataset-name random text jsonl --dataset-path a b: a for text, b for jsonl; too few is an error, and
    so is none for a dataset the built-in text cannot stand in for (jsonl)."""
    args = parse_args(["--dataset-name", "random", "text", "jsonl", "--dataset-path", "a.txt", "b.jsonl"])
    assert [(c.name, c.path) for c in args.datasets] == [
        ("random", None),
        ("text", Path("a.txt")),
        ("jsonl", Path("b.jsonl")),
    ]
    # the built-in model's default drafters: none and what openinfer-serve runs; n-gram with a model of one's own
    assert args.max_concurrency == [1, 4, 8] and [d.label for d in args.drafters] == [
        "none",
        "dspark:K=7:adaptive",
    ]
    own = parse_args(["--model", "/m"])
    assert [d.label for d in own.drafters] == ["none", "ngram:K=7"]
    with pytest.raises(SystemExit):
        parse_args(["--dataset-name", "text", "jsonl", "--dataset-path", "a.txt"])
    with pytest.raises(SystemExit):
        parse_args(["--dataset-name", "text", "jsonl"])


def result(
    tally: AcceptanceTally | None, has_histogram: bool = True, prefix: PrefixCacheCounts | None = None
) -> BenchResult:
    """A run of 2 requests of 11 tokens in 1 s, with these spec-decode deltas (None: no drafter) and these
    prefix-cache deltas (None: no prefix-cache counters)."""
    load = LoadReport([RequestOutcome(4, 11, 0.01, 0.11, (0.01,) * 10)] * 2, 1.0, 1, math.inf)
    engines = {} if tally is None else {0: tally}
    before = MetricsSnapshot({}, has_histogram, 0.0, 0.0, True)
    after = MetricsSnapshot(engines, has_histogram, 1.0, 1.0, True)
    prefix_cache = PrefixCacheReport({}, {} if prefix is None else {"0": prefix}, None)
    return BenchResult("m", load, AcceptanceReport(before, after), None, None, prefix_cache)


def test_markdown_table_rows() -> None:
    """A row per run: throughput and latency, then the seed's acceptance figures; "-" without a drafter and
    "n/a" for the histogram a vLLM server does not export; the prefix-cache hit rate last, "n/a" without its
    counters."""
    tally = AcceptanceTally(4, 8, 3, [2, 1], [1, 2, 1], 2)
    no_hist = AcceptanceTally(4, 8, 3, [2, 1], [], 2)
    cells = [
        SweepCell("random", "none", 1, result(None)),
        SweepCell("random", "ngram:K=2", 4, result(tally, prefix=PrefixCacheCounts(queries=80, hits=48))),
        SweepCell("text (a.txt)", "vllm", 8, result(no_hist, has_histogram=False)),
    ]
    lines = markdown_table(cells).splitlines()
    assert lines[0].startswith("| dataset | drafter | concurrency | output tok/s |")
    assert lines[2] == "| random | none | 1 | 22 | 10.0 | 10.00 | - | - | - | - | - | - | - | - | - | n/a |"
    # 22 tokens in 1 s; TPOT (0.11 - 0.01) / 10; 3 of 8 draft tokens accepted in 4 rounds
    assert lines[3] == (
        "| random | ngram:K=2 | 4 | 22 | 10.0 | 10.00 | 4 | 0.750 | 1.750 | 37.5% | 25.0% | 25.0% "
        "| 1 / 2 / 1 | 0.500 0.250 | - | 60.0% |"  # 48 of 80 prompt tokens hit
    )
    assert lines[4].endswith("| 4 | 0.750 | 1.750 | 37.5% | n/a | n/a | n/a | 0.500 0.250 | - | n/a |")


def test_plot_series_per_drafter_and_dataset(tmp_path: Path) -> None:
    """Runs of one drafter on one dataset are summed over concurrencies into one series; the PNG is written."""
    tally = AcceptanceTally(4, 8, 3, [2, 1], [1, 2, 1], 2)
    cells = [
        SweepCell("random", "ngram", 1, result(tally)),
        SweepCell("random", "ngram", 4, result(tally)),
        SweepCell("random", "none", 1, result(None)),
    ]
    series = plot_series(cells)
    assert [(s.label, s.tally.num_drafts, s.tally.hist) for s in series] == [("ngram / random", 8, [2, 4, 2])]
    out = tmp_path / "sweep.png"
    plot_acceptance([*series, PlotSeries("vllm", tally, has_histogram=False)], out, "test")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
