"""``openinfer-verify-log``: check that ``/metrics`` equals the engines' spec logs, bin by bin.

::

    openinfer-verify-log --metrics-url http://HOST:PORT/metrics --spec-log FILE [FILE ...]
        [--engines-url http://HOST:PORT/admin/engines] [--since UNIX_TIME] [--json OUT]

Per engine and summed over engines it compares drafts, draft tokens, accepted tokens, the per-position
accepted counts, the accepted-length histogram, the per-position verified counts, the unverified draft
tokens (rounds whose verify length the scheduler cut: a log line names the tokens proposed and verified),
and the per-position reached counts and confidence sums (a line names its drafts' confidences as the
integers counted), and prints the acceptance table (a "metrics = logs" column where they agree, a column
each and the differing rows marked where not), with each position's conditional acceptance (accepted /
verified) and the confidence head's calibration (mean confidence beside accepted / reached). On
the same server lifetime the two are equal (docs/design.md, verification log). With ``--engines-url`` (the
admin key from ``$OPENINFER_ADMIN_API_KEY``, else ``$OPENINFER_API_KEY``) only the lines the frontend counted
are compared, exactly, whenever engines were killed: each line names the seq of the snapshot that carries it,
the frontend says which seqs of each incarnation it counted, and the lines it never received (an unsent tail:
the engine died between writing them and sending their snapshot) or that came before what it counted are
reported apart, not as differences; so is a line cut short by a kill.
Exit 0: equal; 1: a bin differs or a log line is not a round; 2: usage, I/O or an unreadable /metrics or
/admin/engines.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from openinfer.protocol.counters import CONFIDENCE_SCALE
from openinfer.tools.delivered import Delivered, fetch_delivered
from openinfer.tools.spec_tally import (
    AcceptanceTally,
    SpecLogTally,
    read_spec_logs,
    scrape_metrics,
    tally_metrics,
    total,
)

ALL = "all"  # the section summed over engines
NOT_AVAILABLE = "n/a"  # a value the source does not export


@dataclass(frozen=True)
class Difference:
    """One bin where /metrics and the logs disagree; ``section`` is an engine index or "all"."""

    section: str
    bin: str
    metrics: int
    logs: int

    def describe(self) -> str:
        where = "all engines" if self.section == ALL else f"engine {self.section}"
        return f"{where}: {self.bin}: metrics {self.metrics}, logs {self.logs}"


def sections(
    metrics: dict[int, AcceptanceTally], logs: dict[int, AcceptanceTally]
) -> list[tuple[str, AcceptanceTally, AcceptanceTally]]:
    """(name, metrics tally, logs tally) for every engine either side knows, then summed over them."""
    indexes = sorted(set(metrics) | set(logs))
    rows = [(str(i), metrics.get(i, AcceptanceTally()), logs.get(i, AcceptanceTally())) for i in indexes]
    rows.append((ALL, total(metrics.values()), total(logs.values())))
    return rows


def compare(metrics: dict[int, AcceptanceTally], logs: dict[int, AcceptanceTally]) -> list[Difference]:
    """Every bin, per engine and summed, where the two tallies differ."""
    differences = []
    for name, from_metrics, from_logs in sections(metrics, logs):
        num_pos = max(_num_pos(from_metrics), _num_pos(from_logs))
        num_hist = max(len(from_metrics.hist), len(from_logs.hist))
        ours, theirs = from_metrics.bins(num_pos, num_hist), from_logs.bins(num_pos, num_hist)
        differences += [Difference(name, b, ours[b], theirs[b]) for b in ours if ours[b] != theirs[b]]
    return differences


def uncounted_lines(logs: SpecLogTally) -> list[str]:
    """One line per engine with drafts /metrics does not hold by design: an unsent tail, or earlier ones."""
    lines = []
    for index, tally in sorted(logs.unsent.items()):
        lines.append(f"unsent tail: engine {index}: {tally.num_drafts} drafts whose snapshot never reached "
                     "this frontend (not in /metrics: their engine died before sending it, or this frontend "
                     "never saw that incarnation)")  # fmt: skip
    for where in logs.cut:
        lines.append(f"cut by a kill: {where}")
    for index, tally in sorted(logs.earlier.items()):
        lines.append(f"earlier: engine {index}: {tally.num_drafts} drafts in the first snapshot this frontend "
                     "saw (counted before it, if at all)")  # fmt: skip
    return lines


def format_table(name: str, from_metrics: AcceptanceTally, from_logs: AcceptanceTally) -> str:
    """The acceptance table of one section: one value column where the sources agree, two where not."""
    title = "all engines" if name == ALL else f"engine {name}"
    rows = list(zip(_rows(from_metrics, from_logs), _rows(from_logs, from_metrics), strict=True))
    width = max(len(label) for (label, _), _ in rows) + 2
    lines = []
    if all(mine == theirs for (_, mine), (_, theirs) in rows):
        lines.append(f"{title:<{width}}metrics = logs")
        lines += [f"{label:<{width}}{value}" for (label, value), _ in rows]
    else:
        lines.append(f"{title:<{width}}{'metrics':<16}logs")
        for (label, mine), (_, theirs) in rows:
            mark = "   <-- differs" if mine != theirs else ""
            lines.append(f"{label:<{width}}{mine:<16}{theirs}{mark}".rstrip())
    return "\n".join(lines)


def _rows(tally: AcceptanceTally, other: AcceptanceTally) -> list[tuple[str, str]]:
    """(label, value) rows of one tally, with as many bins as the wider of the two."""
    return acceptance_rows(
        tally,
        k=max(tally.num_spec_tokens, other.num_spec_tokens),
        num_pos=max(len(tally.per_pos), len(other.per_pos)),
        num_hist=max(len(tally.hist), len(other.hist)),
        num_draft_pos=max(_num_pos(tally), _num_pos(other)),
        num_reached_pos=max(len(tally.reached_per_pos), len(other.reached_per_pos)),
    )


def _num_pos(tally: AcceptanceTally) -> int:
    """The positions any per-position tally has."""
    return max(
        len(tally.per_pos),
        len(tally.draft_per_pos),
        len(tally.reached_per_pos),
        len(tally.confidence_micros_per_pos),
    )


def acceptance_rows(
    tally: AcceptanceTally,
    *,
    k: int,
    num_pos: int,
    num_hist: int | None,
    num_draft_pos: int = 0,
    num_reached_pos: int = 0,
) -> list[tuple[str, str]]:
    """(label, value) rows of the seed's acceptance table: counts, rates, ``hist[0..]`` and per-position rates;
    with ``num_draft_pos`` > 0, also the unverified draft tokens and that many positions' conditional rates
    (accepted / verified at the position: what the drafter's token there is worth when it is checked); with
    ``num_reached_pos`` > 0, that many positions' confidence calibration: the confidence head's mean rating
    beside the measured acceptance of the drafts that reached the position (verified, every token before it
    accepted), with the counts they come from.

    ``k`` is the full-K bin; ``num_pos``, ``num_hist`` and ``num_draft_pos`` the bins shown (padded with
    zeros). ``num_hist`` None: the source has no accepted-length histogram (vLLM exports none), so
    zero-accept, full-K and the ``hist[0..k]`` rows say "n/a". ``num_draft_pos`` 0: it has no per-position
    verified counts (vLLM), so no such rows.
    """
    bins = tally.bins(max(num_pos, num_draft_pos, num_reached_pos), num_hist or 0)
    drafts = tally.num_drafts
    rows = [
        ("rounds (drafts)", str(drafts)),
        ("draft tokens", str(tally.num_draft_tokens)),
        ("accepted tokens", str(tally.num_accepted_tokens)),
        ("mean accepted draft", _number(tally.mean_accepted)),
        ("mean acceptance length", _number(tally.mean_acceptance_length)),
        ("acceptance rate", _percent(tally.acceptance_rate)),
    ]
    if num_hist is None:
        rows += [("zero-accept", NOT_AVAILABLE), (f"full-K (K={k})", NOT_AVAILABLE)]
        rows += [(f"hist[{n}]", NOT_AVAILABLE) for n in range(k + 1)]
    else:
        full = _at(bins, f"hist[{k}]") / drafts if drafts else math.nan
        rows += [("zero-accept", _percent(tally.zero_accept_rate)), (f"full-K (K={k})", _percent(full))]
        rows += [(f"hist[{n}]", str(bins[f"hist[{n}]"])) for n in range(num_hist)]
    for i in range(num_pos):
        count = bins[f"per_pos[{i}]"]
        rows.append(
            (f"per-position rate[{i}]", f"{_number(count / drafts if drafts else math.nan)} ({count})")
        )
    if num_draft_pos:
        rows.append(("unverified draft tokens", str(tally.num_unverified_tokens)))
    for i in range(num_draft_pos):
        accepted, verified = bins[f"per_pos[{i}]"], bins[f"draft_per_pos[{i}]"]
        rate = _number(accepted / verified if verified else math.nan)
        rows.append((f"conditional rate[{i}]", f"{rate} ({accepted}/{verified})"))
    for i in range(num_reached_pos):
        accepted, reached = bins[f"per_pos[{i}]"], bins[f"reached_per_pos[{i}]"]
        micros = bins[f"confidence_micros_per_pos[{i}]"]
        confidence = _number(micros / CONFIDENCE_SCALE / reached if reached else math.nan)
        measured = _number(accepted / reached if reached else math.nan)
        rows.append(
            (
                f"calibration[{i}]",
                f"confidence {confidence}, accepted {measured} ({micros}/1e6, {accepted} of {reached} reached)",
            )
        )
    return rows


def _at(bins: dict[str, int], name: str) -> int:
    return bins.get(name, 0)


def _number(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def _percent(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.1f}%"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="openinfer-verify-log",
        description="Compare a frontend's /metrics with the engines' --spec-log files, bin by bin "
        "(exit 0: equal, 1: a difference or a bad log line, 2: usage or I/O error).",
    )
    parser.add_argument(
        "--metrics-url", required=True, help="the frontend's /metrics, e.g. http://HOST:8000/metrics"
    )
    parser.add_argument(
        "--spec-log",
        required=True,
        nargs="+",
        type=Path,
        metavar="FILE",
        help="the engines' spec logs (openinfer-serve --spec-log-dir DIR writes DIR/spec-engine<i>.jsonl)",
    )
    parser.add_argument(
        "--since",
        type=float,
        metavar="UNIX_TIME",
        help="count only drafts at or after this time: the server lifetime /metrics covers (spec logs are "
        "appended across restarts)",
    )
    parser.add_argument(
        "--engines-url",
        metavar="URL",
        help="the frontend's /admin/engines, e.g. http://HOST:8000/admin/engines (its admin key from "
        "$OPENINFER_ADMIN_API_KEY, else $OPENINFER_API_KEY): compare only the drafts whose snapshots it "
        "counted, and report an unsent tail (drafts of engines killed before sending them) apart",
    )
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the comparison as JSON here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Run the check and exit with its status."""
    sys.exit(run(parse_args(argv)))


def run(args: argparse.Namespace) -> int:
    delivered: Delivered | None = None
    if args.engines_url is not None:
        try:
            key = os.environ.get("OPENINFER_ADMIN_API_KEY") or os.environ.get("OPENINFER_API_KEY")
            delivered = fetch_delivered(args.engines_url, key)
        except OSError as e:
            print(f"openinfer-verify-log: cannot read {args.engines_url}: {e} (is "
                  "$OPENINFER_ADMIN_API_KEY the frontend's admin key?)", file=sys.stderr)  # fmt: skip
            return 2
        except ValueError as e:
            print(f"openinfer-verify-log: {args.engines_url}: {e}", file=sys.stderr)
            return 2
    try:
        logs = read_spec_logs(args.spec_log, since=args.since, delivered=delivered)
    except OSError as e:
        print(f"openinfer-verify-log: cannot read a spec log: {e}", file=sys.stderr)
        return 2
    try:
        metrics = tally_metrics(scrape_metrics(args.metrics_url))
    except OSError as e:
        print(f"openinfer-verify-log: cannot scrape {args.metrics_url}: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"openinfer-verify-log: {args.metrics_url} is not a usable exposition: {e}", file=sys.stderr)
        return 2

    table = sections(metrics, logs.engines)
    print("\n\n".join(format_table(name, mine, theirs) for name, mine, theirs in table))
    differences = compare(metrics, logs.engines)
    print()
    for line in logs.malformed:
        print(f"not a draft: {line}")
    for difference in differences:
        print(f"differs: {difference.describe()}")
    for line in uncounted_lines(logs):
        print(line)
    equal = not differences and not logs.malformed
    if equal:
        drafts, engines = table[-1][1].num_drafts, len(table) - 1
        print(f"OK: /metrics equals the spec logs bin by bin ({drafts} drafts, {engines} engine(s))")
    else:
        print(f"FAILED: {len(differences)} differing bins, {len(logs.malformed)} unreadable log lines")

    if args.json is not None:
        report = {
            "equal": equal,
            "differences": [asdict(d) for d in differences],
            "malformed_lines": logs.malformed,
            "cut_lines": logs.cut,
            "unsent": {str(i): t.to_json() for i, t in sorted(logs.unsent.items())},
            "earlier": {str(i): t.to_json() for i, t in sorted(logs.earlier.items())},
            "sections": {name: {"metrics": m.to_json(), "logs": g.to_json()} for name, m, g in table},
        }
        try:
            args.json.write_text(json.dumps(report, indent=2) + "\n")
        except OSError as e:
            print(f"openinfer-verify-log: cannot write {args.json}: {e}", file=sys.stderr)
            return 2
    return 0 if equal else 1


if __name__ == "__main__":
    main()
