"""Prefix-cache hits of one fixed request sequence, side by side on several servers; not a test.

    python benchmarks/prefix_cache_check.py --base-url http://127.0.0.1:8000 [--base-url URL ...] [--json OUT]

Sends the same token-id prompts one after another (each waits for the previous answer) to every server, greedy,
``--max-tokens`` each: a first prompt; the same prompt again (cached but for the block holding its last
token); a prompt that is a cached prefix; one sharing part of the prefix; that one again; the first turn's
prompt, its answer and a new message (a follow-up turn); an unrelated prompt; a long prompt and that prompt
with a few more tokens. Prints each request's ``usage.prompt_tokens_details.cached_tokens`` per server, and
the servers' ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` deltas over the run
(summed over engines), which must equal the prompt tokens sent and the cached tokens reported.

Run it against vLLM and openinfer serving the same model with the same block size (vLLM's CPU build takes
multiples of 32: ``--block-size 32 --enable-prompt-tokens-details``, and ``openinfer-engine --block-size 32``);
the cached-token columns must agree.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

QUERIES, HITS = "vllm:prefix_cache_queries", "vllm:prefix_cache_hits"


def sequence(vocab_size: int, seed: int, long_len: int = 1200) -> list[tuple[str, list[int]]]:
    """The request sequence, as (name, prompt token ids); "follow-up" is completed from the first answer."""
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(3, vocab_size) for _ in range(n)]

    shared = tokens(40)
    first, other, long_prompt = shared + tokens(20), shared + tokens(20), tokens(long_len)
    return [
        ("first", first), ("same", first), ("prefix", shared[:32]), ("other", other), ("other again", other),
        ("follow-up", first), ("unrelated", tokens(30)), ("long", long_prompt), ("long + 9", long_prompt + tokens(9)),
    ]  # fmt: skip


def post(base_url: str, body: dict) -> dict:
    request = urllib.request.Request(
        f"{base_url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


def counters(base_url: str) -> dict[str, float]:
    """The prefix-cache counters summed over engines (0 where the server exports none)."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=30) as response:
        text = response.read().decode()
    totals = {QUERIES: 0.0, HITS: 0.0}
    for family in text_string_to_metric_families(text):
        if family.name in totals:
            totals[family.name] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return totals


def model_of(base_url: str) -> str:
    with urllib.request.urlopen(f"{base_url}/v1/models", timeout=30) as response:
        return json.load(response)["data"][0]["id"]


def run(base_url: str, requests: list[tuple[str, list[int]]], max_tokens: int) -> dict:
    """Each request's cached tokens and the counters' deltas over the run, on one server."""
    model = model_of(base_url)
    before = counters(base_url)
    cached: dict[str, int | None] = {}
    answers: dict[str, list[int]] = {}
    sent = 0
    for name, prompt in requests:
        if name == "follow-up":  # the first turn, its answer, a new message
            prompt = prompt + answers["first"] + prompt[:5]
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "return_token_ids": True}  # fmt: skip
        reply = post(base_url, body)
        choice = reply["choices"][0]
        answers[name] = choice.get("token_ids") or []
        details = (reply.get("usage") or {}).get("prompt_tokens_details") or {}
        cached[name] = details.get("cached_tokens")
        sent += len(prompt)
    after = counters(base_url)
    return {
        "cached_tokens": cached,
        "queries": after[QUERIES] - before[QUERIES],
        "hits": after[HITS] - before[HITS],
        "prompt_tokens": sent,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-url", action="append", required=True, help="server root (repeat for more)")
    parser.add_argument("--vocab-size", type=int, default=512, help="prompt token ids are below this")
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--long-len", type=int, default=1200, help="tokens of the long prompt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    requests = sequence(args.vocab_size, args.seed, args.long_len)
    results = {url: run(url, requests, args.max_tokens) for url in args.base_url}

    print("| request | " + " | ".join(args.base_url) + " |")
    print("|---|" + "---:|" * len(args.base_url))
    for name, _ in requests:
        print(f"| {name} | " + " | ".join(str(r["cached_tokens"][name]) for r in results.values()) + " |")
    for key in ("prompt_tokens", "queries", "hits"):
        print(f"| {key} | " + " | ".join(f"{r[key]:.0f}" for r in results.values()) + " |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    consistent = all(
        r["queries"] == r["prompt_tokens"] and r["hits"] == sum(v or 0 for v in r["cached_tokens"].values())
        for r in results.values()
    )
    agree = len({json.dumps(r["cached_tokens"]) for r in results.values()}) == 1
    print(f"\neach server's counters equal its requests: {consistent}; the servers agree: {agree}")
    sys.exit(0 if consistent and agree else 1)


if __name__ == "__main__":
    main()
