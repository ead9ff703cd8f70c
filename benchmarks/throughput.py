"""Throughput and latency of a running openinfer (or any vLLM-compatible) server, on demand; not a test.

Sends streaming `POST /v1/completions` requests (temperature 0, `ignore_eos`, fixed `max_tokens`) with prompts
cut from tinyshakespeare at seeded random offsets, at each concurrency level in turn, and prints one markdown
table per level:

    python benchmarks/throughput.py --base-url http://127.0.0.1:8000 --concurrency 1 8 --num-prompts 16

Per request, from real timestamps: TTFT = time to the first chunk with non-empty text; E2E = time to the
end of the stream; TPOT = (E2E - TTFT) / (output tokens - 1); output tokens from the final usage chunk
(`stream_options.include_usage`), else the number of chunks with text. Output tok/s is the level's total
output tokens over its wall time, first request sent to last one finished. Prompt lengths assume ~4
characters per token, so they are approximate for any tokenizer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATASET = REPO_ROOT / ".." / "shared" / "datasets" / "tinyshakespeare.txt"
CHARS_PER_TOKEN = 4  # the usual estimate for English BPE tokenizers; prompt lengths are approximate
WARMUP_MAX_TOKENS = 16


@dataclass(frozen=True)
class RequestResult:
    """One request's timings (seconds, from `time.perf_counter`) or the reason it failed."""

    ttft: float | None = None  # None: no text came back
    e2e: float | None = None
    output_tokens: int = 0
    error: str | None = None  # None: success

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first; None with fewer than two tokens."""
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


@dataclass(frozen=True)
class LevelReport:
    """Aggregates for one concurrency level."""

    concurrency: int
    results: list[RequestResult]
    wall_time: float  # seconds, first request sent to last one finished

    @property
    def ok(self) -> list[RequestResult]:
        return [r for r in self.results if r.error is None]

    @property
    def failures(self) -> int:
        return len(self.results) - len(self.ok)

    @property
    def output_throughput(self) -> float:
        return sum(r.output_tokens for r in self.ok) / self.wall_time

    def row(self) -> list[str]:
        ttfts_ms = [r.ttft * 1e3 for r in self.ok if r.ttft is not None]
        tpots_ms = [r.tpot * 1e3 for r in self.ok if r.tpot is not None]
        e2es = [r.e2e for r in self.ok if r.e2e is not None]
        return [
            str(self.concurrency),
            str(len(self.results)),
            f"{self.output_throughput:.1f}",
            _fmt(_mean(ttfts_ms), ".1f"),
            _fmt(percentile(ttfts_ms, 50), ".1f"),
            _fmt(percentile(ttfts_ms, 99), ".1f"),
            _fmt(_mean(tpots_ms), ".2f"),
            _fmt(_mean(e2es), ".3f"),
            str(self.failures),
        ]


TABLE_HEADER = [
    "concurrency",
    "requests",
    "output tok/s",
    "mean TTFT (ms)",
    "p50 TTFT (ms)",
    "p99 TTFT (ms)",
    "mean TPOT (ms)",
    "mean E2E (s)",
    "failures",
]


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between ranks, as numpy's default."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def sample_prompts(text: str, num_prompts: int, prompt_len: int, seed: int) -> list[str]:
    """`num_prompts` slices of about `prompt_len` tokens, starting and ending on whitespace."""
    num_chars = prompt_len * CHARS_PER_TOKEN
    if len(text) < 2 * num_chars:
        raise SystemExit(f"the dataset has {len(text)} characters, too few for {prompt_len}-token prompts")
    rng = random.Random(seed)
    prompts = []
    for _ in range(num_prompts):
        start = rng.randrange(0, len(text) - 2 * num_chars)
        start = text.find(" ", start) + 1  # begin on a word: the slice keeps >= num_chars characters
        prompt = text[start : start + num_chars]
        cut = max(prompt.rfind(" "), prompt.rfind("\n"))
        prompts.append(prompt[:cut] if cut > 0 else prompt)
    return prompts


async def fetch_first_model(session: aiohttp.ClientSession, base_url: str) -> str:
    try:
        async with session.get(f"{base_url}/v1/models") as resp:
            if resp.status != 200:
                raise SystemExit(f"GET {base_url}/v1/models answered {resp.status}: pass --model")
            models = (await resp.json())["data"]
    except aiohttp.ClientError as exc:
        raise SystemExit(f"cannot reach {base_url} ({exc}): is the server running?") from exc
    if not models:
        raise SystemExit(f"{base_url}/v1/models lists no model: pass --model")
    return str(models[0]["id"])


async def send_request(
    session: aiohttp.ClientSession, base_url: str, model: str, prompt: str, max_tokens: int
) -> RequestResult:
    """One streaming completion, timed from just before the POST."""
    payload = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft: float | None = None
    text_chunks = 0
    usage_tokens: int | None = None
    done = False
    try:
        async with session.post(f"{base_url}/v1/completions", json=payload) as resp:
            if resp.status != 200:
                body = (await resp.text())[:200]
                return RequestResult(error=f"HTTP {resp.status}: {body}")
            async for raw_line in resp.content:  # server-sent events, one `data: ...` line each
                line = raw_line.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue  # blank separators, `:` comments, `event:` lines
                data = line.removeprefix("data:").strip()
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    return RequestResult(error=f"stream error: {chunk['error']}")
                for choice in chunk.get("choices") or []:
                    if choice.get("text"):
                        text_chunks += 1
                        if ttft is None:
                            ttft = time.perf_counter() - start
                usage = chunk.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    usage_tokens = int(usage["completion_tokens"])
    except (TimeoutError, aiohttp.ClientError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        return RequestResult(error=f"{type(exc).__name__}: {exc}")
    e2e = time.perf_counter() - start
    if not done:
        return RequestResult(error="stream ended without data: [DONE]")
    output_tokens = usage_tokens if usage_tokens is not None else text_chunks
    if output_tokens == 0 or ttft is None:
        return RequestResult(error="no output text")
    return RequestResult(ttft=ttft, e2e=e2e, output_tokens=output_tokens)


async def run_level(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    prompts: list[str],
    concurrency: int,
    max_tokens: int,
) -> LevelReport:
    """Send every prompt with at most `concurrency` requests in flight."""
    queue = list(reversed(prompts))
    results: list[RequestResult] = []

    async def worker() -> None:
        while queue:
            results.append(await send_request(session, base_url, model, queue.pop(), max_tokens))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return LevelReport(concurrency=concurrency, results=results, wall_time=time.perf_counter() - start)


async def benchmark(args: argparse.Namespace) -> None:
    base_url = args.base_url.rstrip("/")
    text = args.dataset_path.read_text(encoding="utf-8")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=args.request_timeout)
    connector = aiohttp.TCPConnector(limit=max(args.concurrency))
    async with aiohttp.ClientSession(headers=headers, timeout=timeout, connector=connector) as session:
        model = args.model or await fetch_first_model(session, base_url)
        print(
            f"model {model} at {base_url}: prompts ~{args.prompt_len} tokens, max_tokens {args.max_tokens}, "
            f"seed {args.seed}\n"
        )
        warmup_prompt = sample_prompts(text, 1, args.prompt_len, args.seed + 1)[0]
        warmup = await send_request(session, base_url, model, warmup_prompt, WARMUP_MAX_TOKENS)
        if warmup.error is not None:
            raise SystemExit(f"warm-up request failed: {warmup.error}")

        reports = []
        for concurrency in args.concurrency:
            prompts = sample_prompts(text, max(args.num_prompts, concurrency), args.prompt_len, args.seed)
            report = await run_level(session, base_url, model, prompts, concurrency, args.max_tokens)
            reports.append(report)
            print(f"### concurrency {concurrency}\n\n{markdown_table([report.row()])}\n")
            errors = sorted({r.error for r in report.results if r.error is not None})
            if errors:
                print("\n".join(f"failure: {error}" for error in errors[:5]) + "\n")
        if len(reports) > 1:
            print(f"### all levels\n\n{markdown_table([r.row() for r in reports])}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root, without /v1")
    parser.add_argument("--model", default=None, help="model name (default: the first from /v1/models)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8], help="levels, run in turn")
    parser.add_argument(
        "--num-prompts", type=int, default=16, help="requests per level (at least the concurrency)"
    )
    parser.add_argument("--max-tokens", type=int, default=128, help="output tokens per request (ignore_eos)")
    parser.add_argument("--prompt-len", type=int, default=64, help="prompt length in tokens, approximate")
    parser.add_argument("--dataset-path", type=Path, default=DEFAULT_DATASET, help="text to cut prompts from")
    parser.add_argument("--seed", type=int, default=0, help="seed for the prompt offsets")
    parser.add_argument("--api-key", default=None, help="sent as a Bearer token when given")
    parser.add_argument(
        "--request-timeout", type=float, default=600, help="seconds to wait on a silent stream"
    )
    args = parser.parse_args(argv)
    if min(args.concurrency) < 1 or args.num_prompts < 1 or args.max_tokens < 1 or args.prompt_len < 1:
        parser.error("--concurrency, --num-prompts, --max-tokens and --prompt-len must be positive")
    return args


def main(argv: list[str] | None = None) -> None:
    """Entry point: `python benchmarks/throughput.py --help`."""
    asyncio.run(benchmark(parse_args(argv)))


if __name__ == "__main__":
    main()
