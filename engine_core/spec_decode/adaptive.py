"""Adaptive verification (``--enable-adaptive-verification``, vLLM's name; DSpark's confidence-scheduled draft
budget): how many of each round's drafts the target verifies, chosen for the whole next step.

Every round r has a survival estimate per draft position k, a[r][k]: the chance that draft k and every draft
before it are accepted (non-increasing in k). DSpark's confidence head gives it live, as the product of its
per-draft confidences; any other drafter gets it from its acceptance counters (:func:`counter_survival`).
With R rounds and ``base`` tokens in the step besides drafts, verifying the b slots of highest survival yields
``base + sum of their a`` tokens in expectation and costs ``T(base + b)`` seconds plus each round's attention
over its context (:class:`StepCosts`, measured by the engine at start and refreshed by every step it runs);
the budget is the b with the most expected tokens per second over all b from 0 (verify nothing: drafting
that does not pay is not verified) to every slot, and each round verifies the prefix of its slots among them
(survival never rises along a round, so the admitted slots of a round are its first ones). Estimates from
counters learn only from verified drafts, so every ``EXPLORE_EVERY``-th round left out is verified whole.

A round's attention is priced by its context: a request of q queries over c tokens of context costs
``(c - c0) * (per_key + per_pair * q)`` seconds more than the forward's points, measured at c0 tokens, say
(:class:`AttentionCosts`): reading the keys once, plus what each query adds. So at a long context a draft
slot costs what its queries' attention costs there, and fewer are verified where that does not pay.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from openinfer.engine_core.worker.executor import ModelExecutor
from openinfer.engine_core.worker.step_batch import SeqChunk, step_of_chunks
from openinfer.protocol import SpecDecodeCounters

# A request's own acceptance counts weigh in against the engine's as if the engine's were this many rounds.
PRIOR_ROUNDS = 4
# A drafter whose acceptance comes from its counters has every this-many-th round the budget leaves out
# verified whole, so that its estimates keep learning.
EXPLORE_EVERY = 16
# How much one observed step moves the overhead estimate (an exponential moving average).
COST_EMA = 0.1
# The context the start-up profile prices attention at, in tokens (capped by the model length and the cache).
LONG_CONTEXT = 2048


@dataclass(frozen=True)
class AttentionCosts:
    """Seconds one request's attention adds per token of context past ``base_context`` (the context the
    forward's points were measured at): ``per_key`` for reading it, ``per_pair`` more for each query."""

    base_context: int
    per_key: float
    per_pair: float

    def seconds(self, queries: int, context: int) -> float:
        """The extra seconds of ``queries`` queries over ``context`` tokens of context."""
        return max(0, context - self.base_context) * (self.per_key + self.per_pair * queries)


class StepCosts:
    """Seconds a step of n tokens takes: the target's forward, measured at sizes ``points`` (ascending; linear
    in between and past the last one, never decreasing with n), its requests' attention past the context
    the points were measured at (``attention``; None: not priced), plus the step's overhead (scheduling,
    sampling, drafting, the read-back: what does not grow with the drafts verified), learned from the steps
    the engine runs (``observe``)."""

    def __init__(
        self, points: dict[int, float], overhead: float = 0.0, attention: AttentionCosts | None = None
    ) -> None:
        if not points or min(points) < 1 or min(points.values()) <= 0 or overhead < 0:
            raise ValueError(f"step costs need positive seconds at sizes >= 1, got {points} + {overhead}")
        if attention is not None and min(attention.per_key, attention.per_pair) < 0:
            raise ValueError(f"attention costs are never negative, got {attention}")
        self._sizes = sorted(points)
        self._seconds = list(accumulate((points[n] for n in self._sizes), max))  # non-decreasing in n
        self.overhead = overhead
        self.attention = attention

    def forward(self, num_tokens: int) -> float:
        """The estimated seconds of the target's forward over ``num_tokens`` tokens."""
        sizes, seconds = self._sizes, self._seconds
        if num_tokens <= sizes[0]:
            return seconds[0]
        if len(sizes) == 1:
            return seconds[0] * num_tokens / sizes[0]
        i = next((i for i, n in enumerate(sizes) if n >= num_tokens), len(sizes) - 1)
        (n0, t0), (n1, t1) = (sizes[i - 1], seconds[i - 1]), (sizes[i], seconds[i])
        return t0 + (t1 - t0) * (num_tokens - n0) / (n1 - n0)

    def seconds(self, num_tokens: int) -> float:
        """The estimated seconds of a whole step of ``num_tokens`` tokens at the points' context."""
        return self.forward(num_tokens) + self.overhead

    def attention_seconds(self, queries: int, context: int) -> float:
        """The extra seconds of a request's ``queries`` queries over ``context`` tokens (0 when unpriced)."""
        return 0.0 if self.attention is None else self.attention.seconds(queries, context)

    def observe(self, num_tokens: int, seconds: float, attention: float = 0.0) -> None:
        """A step of ``num_tokens`` whose requests' attention is estimated at ``attention`` seconds took
        ``seconds``: the overhead moves towards what is left of it after the estimates."""
        if num_tokens >= 1 and seconds > 0:
            left = seconds - self.forward(num_tokens) - attention
            self.overhead = max(0.0, self.overhead + COST_EMA * (left - self.overhead))

    def describe(self) -> str:
        forward = ", ".join(f"{n}: {1000 * t:.2f}" for n, t in zip(self._sizes, self._seconds, strict=True))
        text = f"forward ms by tokens {{{forward}}} + overhead {1000 * self.overhead:.2f} ms"
        if self.attention is not None:
            a = self.attention
            text += (
                f" + attention past {a.base_context} tokens of context: {1e6 * a.per_key:.3f} µs a token "
                f"+ {1e6 * a.per_pair:.3f} µs a token per query"
            )
        return text


def verify_lengths(
    survival: Sequence[Sequence[float]],
    costs: StepCosts,
    base_tokens: int,
    contexts: Sequence[int] | None = None,
) -> list[int]:
    """How many drafts each round verifies: the slots that maximise (base_tokens + their survival) / T, T the
    step of base_tokens + their number of tokens plus each round's attention over its context
    (``contexts[r]``, the tokens round r attends to before its own; None: every round at the points'
    context) with 1 + its admitted slots as queries; verifying none included.

    Slots are taken in order of survival less the best rate so far times their attention (Dinkelbach's
    ratio iteration, from survival alone; ties: earlier positions first), each order scanned for its best
    prefix, until the rate stops rising. A round's slots share one attention cost and their survival never
    rises, so every order admits a prefix of each round."""
    contexts = contexts if contexts is not None else [0] * len(survival)
    # every round's own token attends whatever is verified; each admitted slot adds a query to its round
    base_attention = sum(costs.attention_seconds(1, c) for c in contexts)
    per_slot = [costs.attention_seconds(2, c) - costs.attention_seconds(1, c) for c in contexts]
    slots = [(a, k, r) for r, row in enumerate(survival) for k, a in enumerate(row)]
    best_rate = base_tokens / (costs.seconds(base_tokens) + base_attention)
    best: list[tuple[float, int, int]] = []
    for _ in range(len(slots) + 1):  # each pass raises the rate or ends it; a few passes in practice
        rate = best_rate
        order = sorted(slots, key=lambda s: (-(s[0] - rate * per_slot[s[2]]), s[1]))
        expected, attention, improved = float(base_tokens), base_attention, False
        for b, (a, _, r) in enumerate(order, start=1):
            expected += a
            attention += per_slot[r]
            candidate = expected / (costs.seconds(base_tokens + b) + attention)
            if candidate > best_rate * (1 + 1e-12):
                best_rate, best, improved = candidate, order[:b], True
        if not improved or len(set(per_slot)) <= 1:  # one attention cost a slot: the order is survival's
            break
    lengths = [0] * len(survival)
    for _, _, r in best:
        lengths[r] += 1
    return lengths


def confidence_survival(confidence: Sequence[float]) -> list[float]:
    """A round's survival from its drafts' confidences (each the chance it is accepted given the earlier
    ones were): their running product."""
    return list(accumulate(confidence, lambda a, c: a * c))


def counter_survival(
    engine: SpecDecodeCounters, request: SpecDecodeCounters | None, length: int
) -> list[float]:
    """A round's survival for a drafter that does not rate its drafts: per position k, the share of verified
    drafts whose token k was accepted (with every one before it), the engine's (one success and one failure
    added, so an unseen position is a coin toss) blended with the request's own; made non-increasing."""
    survival: list[float] = []
    for k in range(length):
        rate = (engine.num_accepted_tokens_per_pos[k] + 1) / (engine.num_draft_tokens_per_pos[k] + 2)
        if request is not None:
            accepted, verified = request.num_accepted_tokens_per_pos[k], request.num_draft_tokens_per_pos[k]
            rate = (accepted + PRIOR_ROUNDS * rate) / (verified + PRIOR_ROUNDS)
        survival.append(min(rate, survival[-1]) if survival else rate)
    return survival


def profile_step_costs(
    runner: ModelExecutor,
    num_spec_tokens: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    repeats: int = 3,
) -> StepCosts:
    """Time the target's verify-shaped steps (chunks of K + 1 tokens over a context of a few blocks) at
    1, 2, 4, ... tokens up to the most a step verifies, then one request of 1 and of K + 1 tokens over that
    context and over a long one (LONG_CONTEXT, or what the model length and the cache hold), which prices
    attention by context (:class:`AttentionCosts`): each its median of ``repeats`` runs after one warm-up.
    Runs at engine start, before any request: the KV blocks it writes hold nothing yet."""
    width = num_spec_tokens + 1
    largest = max(1, min(max_num_batched_tokens, max_num_seqs * width))
    sizes = sorted({*(2**i for i in range(largest.bit_length()) if 2**i <= largest), largest})
    page = runner.block_size
    max_context = runner.model_config.max_position_embeddings - width - 1
    short = min(4 * page, max_context)
    points = {}
    for n in sizes:  # n tokens as chunks of K + 1 (the last one shorter)
        lengths = [width] * (n // width) + ([n % width] if n % width else [])
        points[n] = _step_seconds(runner, lengths, short, repeats)
    long = min(LONG_CONTEXT, max_context, (runner.num_kv_blocks - 1) * page - width)
    if long < 2 * short:  # too short a model or cache to tell a context's cost from the noise
        return StepCosts(points)
    decode, verify = (
        (_step_seconds(runner, [q], long, repeats) - _step_seconds(runner, [q], short, repeats))
        / (long - short)
        for q in (1, width)
    )
    per_pair = max(0.0, (verify - decode) / (width - 1))
    return StepCosts(points, attention=AttentionCosts(short, max(0.0, decode - per_pair), per_pair))


def _step_seconds(runner: ModelExecutor, lengths: list[int], context: int, repeats: int) -> float:
    """The median seconds of one step of a chunk of each of ``lengths`` tokens over ``context`` tokens,
    after one warm-up (chunks on consecutive blocks, wrapping around the cache)."""
    page = runner.block_size
    # a hybrid model's chunks all read and write the scratch state slot: what they store is never read
    scratch = runner.state_geometry.scratch_slot if runner.state_geometry is not None else None
    chunks, next_block = [], 0
    for q in lengths:
        blocks = -(-(context + q) // page)
        ids = [(next_block + j) % runner.num_kv_blocks for j in range(blocks)]
        next_block += blocks
        chunks.append(SeqChunk([1] * q, context, ids, num_logits=q, state_slot=scratch))
    step = step_of_chunks(chunks, page)
    runner.execute(step).logits[-1, -1].item()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        runner.execute(step).logits[-1, -1].item()  # the read waits for the device
        times.append(time.perf_counter() - start)
    return statistics.median(times)
