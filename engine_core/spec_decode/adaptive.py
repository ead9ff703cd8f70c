"""Adaptive verification (``--enable-adaptive-verification``, vLLM's name; DSpark's confidence-scheduled draft
budget): how many of each round's drafts the target verifies, chosen for the whole next step.

Every round r has a survival estimate per draft position k, a[r][k]: the chance that draft k and every draft
before it are accepted (non-increasing in k). DSpark's confidence head gives it live, as the product of its
per-draft confidences; any other drafter gets it from its acceptance counters (:func:`counter_survival`).
With R rounds and ``base`` tokens in the step besides drafts, verifying the b slots of highest survival yields
``base + sum of their a`` tokens in expectation and costs ``T(base + b)`` seconds (:class:`StepCosts`, measured
by the engine at start and refreshed by every step it runs); the budget is the b with the most expected
tokens per second over all b from 0 (verify nothing: drafting that does not pay is not verified) to every
slot, and each round verifies the prefix of its slots among them (survival never rises along a round, so the
admitted slots of a round are its first ones). Estimates from counters learn only from verified drafts, so
every ``EXPLORE_EVERY``-th round left out is verified whole.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
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


class StepCosts:
    """Seconds a step of n tokens takes: the target's forward, measured at sizes ``points`` (ascending; linear
    in between and past the last one, never decreasing with n), plus the step's overhead (scheduling,
    sampling, drafting, the read-back: what does not grow with the drafts verified), learned from the steps
    the engine runs (``observe``)."""

    def __init__(self, points: dict[int, float], overhead: float = 0.0) -> None:
        if not points or min(points) < 1 or min(points.values()) <= 0 or overhead < 0:
            raise ValueError(f"step costs need positive seconds at sizes >= 1, got {points} + {overhead}")
        self._sizes = sorted(points)
        self._seconds = list(accumulate((points[n] for n in self._sizes), max))  # non-decreasing in n
        self.overhead = overhead

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
        """The estimated seconds of a whole step of ``num_tokens`` tokens."""
        return self.forward(num_tokens) + self.overhead

    def observe(self, num_tokens: int, seconds: float) -> None:
        """A step of ``num_tokens`` took ``seconds``: the overhead moves towards what is left of it after the
        forward's estimate."""
        if num_tokens >= 1 and seconds > 0:
            self.overhead = max(
                0.0, self.overhead + COST_EMA * (seconds - self.forward(num_tokens) - self.overhead)
            )

    def describe(self) -> str:
        forward = ", ".join(f"{n}: {1000 * t:.2f}" for n, t in zip(self._sizes, self._seconds, strict=True))
        return f"forward ms by tokens {{{forward}}} + overhead {1000 * self.overhead:.2f} ms"


def verify_lengths(survival: Sequence[Sequence[float]], costs: StepCosts, base_tokens: int) -> list[int]:
    """How many drafts each round verifies: the b slots of highest survival (ties: earlier positions first)
    for the b that maximises (base_tokens + their survival) / T(base_tokens + b), b = 0 included."""
    slots = sorted(
        ((a, k, r) for r, row in enumerate(survival) for k, a in enumerate(row)), key=lambda s: (-s[0], s[1])
    )
    expected, best_rate, best = float(base_tokens), base_tokens / costs.seconds(base_tokens), 0
    for b, (a, _, _) in enumerate(slots, start=1):
        expected += a
        rate = expected / costs.seconds(base_tokens + b)
        if rate > best_rate:
            best_rate, best = rate, b
    lengths = [0] * len(survival)
    for _, _, r in slots[:best]:
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
    1, 2, 4, ... tokens up to the most a step verifies: each size's median of ``repeats`` runs after one
    warm-up. Runs at engine start, before any request: the KV blocks it writes hold nothing yet."""
    width = num_spec_tokens + 1
    largest = max(1, min(max_num_batched_tokens, max_num_seqs * width))
    sizes = sorted({*(2**i for i in range(largest.bit_length()) if 2**i <= largest), largest})
    page = runner.block_size
    context = min(4 * page, runner.model_config.max_position_embeddings - width - 1)
    # a hybrid model's chunks all read and write the scratch state slot: what they store is never read
    scratch = runner.state_geometry.scratch_slot if runner.state_geometry is not None else None
    points = {}
    for n in sizes:
        lengths = [width] * (n // width) + ([n % width] if n % width else [])
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
        points[n] = statistics.median(times)
    return StepCosts(points)
