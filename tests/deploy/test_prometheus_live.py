"""deploy/'s Prometheus rules, federation and dashboard against real processes.

Two hosts, each a slim frontend with CPU engines doing n-gram speculation (host a: K=7 and K=3, host b:
K=5), each scraped every second by its own Prometheus running deploy/prometheus/prometheus.yml and the
recording rules; a global Prometheus federates both with deploy/prometheus/federation.yml.

How exact the comparison with the spec logs is, and why. rate() extrapolates: over a window [t-60s, t] it
returns (last - first) * (S + d_start + d_end) / (S * 60), S being the time between the window's first and
last samples. The Prometheus servers start only once every engine has joined and before any request, so
every spec-decode series of a host begins with one scrape at 0, all at the same timestamp; for a series
starting at 0 rate() extrapolates nothing before its first sample (d_start = 0), and the last samples are
again one scrape. So while that zero scrape is inside the window (t <= t_zero + 60 s), one factor
multiplies every series of the host: it cancels in every ratio the rules record (acceptance rate, mean
acceptance length, per-position rates, accepted-length shares), which must then equal the spec logs' ratios
up to float rounding, 1e-12 relative. The test reads the rules' evaluation at a time t_eval in that window
and after the load ended and a scrape saw the final counters, one that read a single scrape throughout
(live_host.whole_evaluation says why another may not). The recorded totals (model_name:*:sum) are
exact integers. Across hosts the extrapolation factors differ (their scrapes are not simultaneous), so a
fleet-wide rate ratio weighs each host's exact ratio by its recorded denominator rate; the test checks that
weighting exactly, and the federated totals exactly.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import yaml

from openinfer.engine_core.testing.tiny_model import SMALL_TEXT_QWEN3, make_tiny_checkpoint
from openinfer.tools.spec_tally import total
from tests.deploy.dashboard_queries import dashboard_exprs, metric_names, recorded_names
from tests.deploy.live_host import WINDOW, Host, run_load, wait_for_final_counters, wait_for_zero_scrape
from tests.deploy.recorded_checks import REL, check_host_ratios, check_totals
from tests.deploy.stack import (
    DEPLOY,
    Frontend,
    ProcessGroup,
    Prometheus,
    global_config,
    host_config,
    require_tools,
    wait_until,
)
from tests.e2e.processes import free_port

HOSTS = {"a": (7, 3), "b": (5,)}  # host label -> K of each engine

# deploy/README.md's fleet-wide queries, run on the global Prometheus.
FLEET_ACCEPTANCE_RATE = (
    "sum by (model_name) (model_name:spec_decode_num_accepted_tokens:rate1m)\n"
    "  / sum by (model_name) (model_name:spec_decode_num_draft_tokens:rate1m)"
)
FLEET_MEAN_ACCEPTANCE_LENGTH = (
    "1 + sum by (model_name) (model_name:spec_decode_num_accepted_tokens:rate1m)\n"
    "  / sum by (model_name) (model_name:spec_decode_num_drafts:rate1m)"
)
FLEET_PER_POSITION = (
    "sum by (model_name, position) (model_name:spec_decode_num_accepted_tokens_per_pos:rate1m)\n"
    "  / sum by (model_name, position) (model_name:spec_decode_num_drafts_per_pos:rate1m)"
)
FLEET_CONDITIONAL_PER_POSITION = (
    "sum by (model_name, position) (model_name:spec_decode_num_accepted_tokens_per_pos:rate1m)\n"
    "  / sum by (model_name, position) (model_name:spec_decode_num_draft_tokens_per_pos:rate1m)"
)
FLEET_ACCEPTED_TOKENS = "sum by (model_name) (model_name:spec_decode_num_accepted_tokens:sum)"


@dataclass
class Stack:
    hosts: dict[str, Host]
    fleet: Prometheus
    t_fleet: float  # the global Prometheus holds both hosts' evaluations from their exact windows by now
    processes: ProcessGroup


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require_tools("prometheus")
    work = tmp_path_factory.mktemp("deploy-live")
    processes = ProcessGroup(work)
    try:
        model = make_tiny_checkpoint(
            work / "tiny", seed=3, overrides={**SMALL_TEXT_QWEN3, "max_position_embeddings": 256}
        )
        hosts: dict[str, Host] = {}
        for name, ks in HOSTS.items():
            frontend = Frontend(processes, f"frontend-{name}")
            for index, k in enumerate(ks):
                frontend.start_engine(model, index, k)
            prometheus = Prometheus(processes, f"prometheus-{name}", work, env={"OPENINFER_HOST": name})
            hosts[name] = Host(name, frontend, prometheus)
        for host in hosts.values():
            wait_until(host.frontend.healthy, 90, f"frontend-{host.name} with its engines", processes)
        # Prometheus only now: its first scrape sees every engine's counters at 0.
        fleet = Prometheus(processes, "prometheus-global", work)
        for host in hosts.values():
            host.prometheus.start(host_config(host.frontend, host.prometheus.target))
        fleet.start(global_config([host.prometheus.target for host in hosts.values()]))
        for server in (*(h.prometheus for h in hosts.values()), fleet):
            wait_until(server.ready, 30, f"{server.name} ready", processes)
        for host in hosts.values():
            wait_for_zero_scrape(host, processes)

        asyncio.run(run_load([(hosts["a"].frontend, 8), (hosts["b"].frontend, 4)]))

        for host in hosts.values():
            wait_for_final_counters(host, processes)

        # The global Prometheus: once it holds evaluations of both hosts from their valid windows.
        def federated() -> bool:
            stamps = fleet.vector("timestamp(model_name:spec_decode_num_drafts:sum)", None, "host")
            return all(stamps.get((h.name,), 0) >= h.t_eval for h in hosts.values())

        wait_until(federated, 10, "the global Prometheus to federate both hosts", processes)
        t_fleet = time.time()
        yield Stack(hosts, fleet, t_fleet, processes)
    finally:
        processes.stop()


def test_recorded_acceptance_equals_spec_logs(stack: Stack) -> None:
    """On each host, the recording rules' acceptance rate, mean acceptance length, per-position curves (of all
    drafts, and conditional on the position being verified), unverified share and accepted-length
    distribution (cluster-wide and per engine) equal the engines' spec logs, and the recorded totals equal
    them exactly."""
    for host in stack.hosts.values():
        ks = HOSTS[host.name]
        check_host_ratios(host.prometheus, host.t_eval, host.logs, ks)
        check_totals(host.prometheus, host.t_eval, total(host.logs.values()), max(ks))
    # Host a's two engines both drafted, so the K=3 engine's positions really are mixed with K=7's.
    assert all(tally.num_drafts for tally in stack.hosts["a"].logs.values())


def test_federation_equals_both_hosts_spec_logs(stack: Stack) -> None:
    """The global Prometheus's fleet-wide totals equal the sum of both hosts' spec logs exactly; each
    host's federated ratios equal its logs'; the fleet acceptance rate and per-position curve are one query
    each, summing numerators and denominators over hosts separately."""
    fleet, at = stack.fleet, stack.t_fleet
    hosts = stack.hosts
    k_max = max(max(ks) for ks in HOSTS.values())
    everything = total(tally for host in hosts.values() for tally in host.logs.values())
    check_totals(fleet, at, everything, k_max)
    (accepted,) = fleet.vector(FLEET_ACCEPTED_TOKENS, at).values()
    assert accepted == everything.num_accepted_tokens

    # The host label (each host's external label) keeps the two hosts' identical series apart.
    assert set(fleet.vector("model_name:spec_decode_num_drafts:sum", at, "host")) == {("a",), ("b",)}
    for host in hosts.values():
        ratios = fleet.vector(
            f'model_name:spec_decode_acceptance_rate:ratio_rate1m{{host="{host.name}"}}', at
        )
        host_total = total(host.logs.values())
        (ratio,) = ratios.values()
        assert ratio == pytest.approx(host_total.num_accepted_tokens / host_total.num_draft_tokens, rel=REL)
        stamps = fleet.vector(
            f'timestamp(model_name:spec_decode_acceptance_rate:ratio_rate1m{{host="{host.name}"}})', at
        )
        (stamp,) = stamps.values()
        assert host.t_eval <= stamp <= host.t_zero + WINDOW  # an evaluation from the exact window

    # Fleet-wide acceptance rate: each host's exact rate weighted by its recorded draft-token rate.
    (fleet_rate,) = fleet.vector(FLEET_ACCEPTANCE_RATE, at).values()
    weights = fleet.vector("model_name:spec_decode_num_draft_tokens:rate1m", at, "host")
    expected = sum(weights[(h.name,)] * total(h.logs.values()).acceptance_rate for h in hosts.values()) / sum(
        weights.values()
    )
    assert fleet_rate == pytest.approx(expected, rel=1e-9)
    (fleet_length,) = fleet.vector(FLEET_MEAN_ACCEPTANCE_LENGTH, at).values()
    drafts = fleet.vector("model_name:spec_decode_num_drafts:rate1m", at, "host")
    expected = 1 + sum(
        drafts[(h.name,)] * total(h.logs.values()).mean_accepted for h in hosts.values()
    ) / sum(drafts.values())
    assert fleet_length == pytest.approx(expected, rel=1e-9)

    # The per-position curve: every position of the largest K, non-increasing where all engines have it.
    curve = fleet.vector(FLEET_PER_POSITION, at, "position")
    assert set(curve) == {(str(i),) for i in range(k_max)}
    assert all(0 <= v <= 1 for v in curve.values())
    assert curve[("0",)] >= curve[("1",)] >= curve[("2",)]
    # The conditional curve: at each position, at least the unconditional rate (fewer drafts verify it).
    conditional = fleet.vector(FLEET_CONDITIONAL_PER_POSITION, at, "position")
    assert conditional.keys() <= curve.keys()
    assert all(curve[key] <= value * (1 + 1e-9) and value <= 1 for key, value in conditional.items())


def test_global_prometheus_records_the_fleet(stack: Stack) -> None:
    """federation.yml's fleet rules (rules/openinfer-fleet.yml) on the global Prometheus: the fleet totals
    equal both hosts' spec logs exactly, and the fleet ratios exist for every position of the largest K."""
    fleet = stack.fleet
    everything = total(tally for host in stack.hosts.values() for tally in host.logs.values())
    k_max = max(max(ks) for ks in HOSTS.values())
    expected = {
        "fleet:spec_decode_num_drafts:sum": everything.num_drafts,
        "fleet:spec_decode_num_draft_tokens:sum": everything.num_draft_tokens,
        "fleet:spec_decode_num_accepted_tokens:sum": everything.num_accepted_tokens,
    }

    def recorded() -> bool:  # a fleet evaluation after both hosts' final totals were federated
        return all(list(fleet.vector(name).values()) == [value] for name, value in expected.items())

    wait_until(recorded, 10, "the fleet rules to record both hosts' totals", stack.processes)
    per_pos = fleet.vector("fleet:spec_decode_num_accepted_tokens_per_pos:sum", None, "position")
    assert per_pos == {(str(i),): everything.bins(k_max)[f"per_pos[{i}]"] for i in range(k_max)}
    (rate,) = fleet.vector("fleet:spec_decode_acceptance_rate:ratio_rate1m").values()
    host_rates = [total(h.logs.values()).acceptance_rate for h in stack.hosts.values()]
    assert min(host_rates) * (1 - 1e-9) <= rate <= max(host_rates) * (1 + 1e-9)  # a weighted mean of hosts'
    curve = fleet.vector("fleet:spec_decode_per_pos_acceptance_rate:ratio_rate1m", None, "position")
    assert set(curve) == {(str(i),) for i in range(k_max)}


def test_readme_has_the_fleet_queries() -> None:
    """deploy/README.md shows the fleet-wide queries these tests run."""
    readme = re.sub(r"\s+", " ", (DEPLOY / "README.md").read_text())
    for query in (
        FLEET_ACCEPTANCE_RATE,
        FLEET_MEAN_ACCEPTANCE_LENGTH,
        FLEET_PER_POSITION,
        FLEET_CONDITIONAL_PER_POSITION,
    ):
        assert re.sub(r"\s+", " ", query) in readme


def test_dashboard_queries_use_real_series(stack: Stack) -> None:
    """Every dashboard query names only metrics a live frontend exports or the rules record, and returns
    data on a host Prometheus and on the global one (DSpark's calibration none: no engine here rates its
    drafts)."""
    host = stack.hosts["a"]
    exported = {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][\w:]*)", host.frontend.metrics(), re.M)}
    known = exported | recorded_names()
    for expr in dashboard_exprs():
        unknown = metric_names(expr) - known
        assert not unknown, f"{expr}\nnames no exported or recorded metric: {unknown}"
    # Rule groups run on their own clocks (the serving group's first rates may lag the load by a second),
    # and series such as vllm:generation_tokens_total appear with the first request: poll a little.
    servers = {"host a": host.prometheus, "the global Prometheus": stack.fleet}
    # The prefix-cache panels too: engines cache prefixes by default. DSpark's calibration panels are over the
    # engines whose drafter rates its drafts, and these run n-gram lookup: no series at all, never a mean
    # diluted by engines without confidences.
    rated_only = [e for e in dashboard_exprs() if "mean_confidence" in e or "rated_reached" in e]
    expected = [e for e in dashboard_exprs() if e not in rated_only]
    assert rated_only and not [e for server in servers.values() for e in rated_only if server.query(e)]
    deadline = time.monotonic() + 15
    while True:
        empty = [
            f"{where}: {e}" for where, server in servers.items() for e in expected if not server.query(e)
        ]
        if not empty or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not empty, "queries without data:\n" + "\n".join(empty)


def test_compose_healthchecks_on_live_processes(stack: Stack) -> None:
    """docker-compose.yml's healthchecks pass on a live engine and frontend and fail otherwise (the
    container's PID 1 and port replaced by the live process's)."""
    services = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    frontend = stack.hosts["b"].frontend
    engine = stack.processes.processes["frontend-b-engine0"]
    front = stack.processes.processes["frontend-b"]

    def run(service: str, replace: tuple[str, str]) -> int:
        test = services[service]["healthcheck"]["test"]
        assert test[0] == "CMD"
        argv = [arg.replace(*replace) for arg in test[1:]]
        return subprocess.run(argv, timeout=30, capture_output=True).returncode

    assert run("engine-0", ("/proc/1/", f"/proc/{engine.pid}/")) == 0
    assert run("cpu-engine-0", ("/proc/1/", f"/proc/{engine.pid}/")) == 0
    assert run("engine-0", ("/proc/1/", f"/proc/{front.pid}/")) != 0  # not an engine
    assert run("frontend", ("http://127.0.0.1:8000", frontend.url)) == 0
    assert run("frontend", ("http://127.0.0.1:8000", f"http://127.0.0.1:{free_port()}")) != 0  # nothing there


def test_frontends_needed_only_the_image_packages(stack: Stack) -> None:
    """The frontends ran with only deploy/frontend-requirements.txt's packages importable (as in the slim
    image), and openinfer never tried to import anything else."""
    for host in stack.hosts.values():
        log = (stack.processes.log_dir / f"frontend-{host.name}.log").read_text()
        refused = re.findall(r"slim-frontend: refused import of (\S+) \(by (\S+)\)", log)
        assert not [(module, by) for module, by in refused if by.startswith(("openinfer", "__main__"))], (
            refused
        )
