"""The engine core: one step is schedule -> execute -> update."""

from __future__ import annotations

import logging
import time

import torch

from openinfer.engine_core.config import EngineConfig
from openinfer.engine_core.kv_cache_manager import KVCacheManager
from openinfer.engine_core.model_runner import ModelRunner, SeqChunk
from openinfer.engine_core.models.config import ModelConfig
from openinfer.engine_core.request import Request, RequestStatus
from openinfer.engine_core.scheduler import ScheduledRequest, Scheduler, SchedulerOutput
from openinfer.kernels.sampling import sample
from openinfer.protocol import EngineCoreOutput, EngineCoreRequest, FinishReason, LoadSnapshot

logger = logging.getLogger(__name__)

_FINISH_KIND = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """"auto" is float32 on the CPU (exact parity with transformers) and bfloat16 on CUDA."""
    if name == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


class EngineCore:
    """Requests in, token outputs out; owns the scheduler, the KV cache and the model runner."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        device = torch.device(config.device)
        dtype = resolve_dtype(config.dtype, device)
        model_config = ModelConfig.from_folder(config.model_path)
        num_blocks = config.num_kv_blocks or int(
            config.kv_cache_gb * 2**30 // ModelRunner.kv_block_bytes(model_config, config.block_size, dtype)
        )
        self.runner = ModelRunner(config.model_path, device, num_blocks, config.block_size, dtype)
        self.model_config = model_config
        self.max_model_len = min(
            config.max_model_len or model_config.max_position_embeddings, model_config.max_position_embeddings
        )
        self.eos_token_ids = frozenset(model_config.eos_token_ids)
        self.kv_cache = KVCacheManager(num_blocks, config.block_size)
        self.scheduler = Scheduler(self.kv_cache, config.max_num_seqs, config.max_num_batched_tokens)
        self.requests: dict[str, Request] = {}
        self._ended: list[EngineCoreOutput] = []  # outputs of requests ended outside a step
        torch.manual_seed(config.seed)

    # ---- inputs -------------------------------------------------------------------------------------

    def add_request(self, message: EngineCoreRequest) -> None:
        """Queue a request, or end it at once with an error output saying what was wrong with it."""
        error = self._validate(message)
        if error is not None:
            logger.warning("request %s refused: %s", message.request_id, error)
            self._ended.append(EngineCoreOutput(message.request_id, [], FinishReason("error", message=error)))
            return
        params = message.sampling_params
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.runner.device).manual_seed(params.seed)
        request = Request(
            message.request_id,
            list(message.prompt_token_ids),
            params,
            message.arrival_time or time.time(),
            generator=generator,
        )
        self.requests[request.request_id] = request
        self.scheduler.add(request)

    def _validate(self, message: EngineCoreRequest) -> str | None:
        params = message.sampling_params
        prompt = message.prompt_token_ids
        vocab = self.model_config.vocab_size
        if message.request_id in self.requests:
            return f"request id {message.request_id!r} is already running on this engine"
        if not prompt:
            return "the prompt is empty"
        if any(t < 0 or t >= vocab for t in prompt):
            return f"prompt token ids must be in [0, {vocab})"
        if len(prompt) >= self.max_model_len:
            return f"the prompt has {len(prompt)} tokens; this model's length is {self.max_model_len}"
        if params.max_tokens < 1:
            return f"max_tokens must be >= 1, got {params.max_tokens}"
        if params.temperature < 0 or not 0 < params.top_p <= 1:
            return "temperature must be >= 0 and top_p in (0, 1]"
        if params.top_k is not None and params.top_k < 1:
            return f"top_k must be >= 1 or unset, got {params.top_k}"
        longest = min(len(prompt) + params.max_tokens, self.max_model_len)
        if self.kv_cache.num_blocks_for(longest) > self.kv_cache.num_blocks:
            return (
                f"the request needs up to {longest} tokens of KV cache but this engine holds "
                f"{self.kv_cache.num_blocks * self.kv_cache.block_size}; raise --kv-cache-gb"
            )
        return None

    def abort(self, request_ids: list[str]) -> None:
        """End these requests now (unknown or already ended ids are ignored)."""
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is not None:
                self._finish(request, RequestStatus.FINISHED_ABORTED)
                self._ended.append(self._output(request))

    # ---- the step -----------------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def step(self) -> list[EngineCoreOutput]:
        """Run one model step over the scheduled requests and return what changed for the frontend."""
        outputs, self._ended = self._ended, []
        scheduler_output = self.scheduler.schedule()
        if scheduler_output.scheduled:
            sampled = self._execute(scheduler_output)
            outputs.extend(self._update(scheduler_output, sampled))
        return outputs

    def _execute(self, scheduler_output: SchedulerOutput) -> list[int]:
        """Run the model; return one sampled token per scheduled request that reached its end."""
        chunks = []
        for s in scheduler_output.scheduled:
            start = s.request.num_computed_tokens
            chunks.append(
                SeqChunk(
                    s.request.all_token_ids[start : start + s.num_new_tokens],
                    start,
                    s.request.block_ids,
                    1 if s.samples else 0,
                )
            )
        logits = self.runner.execute(chunks)  # (num sampling requests, vocab) float32
        samplers = [s.request for s in scheduler_output.scheduled if s.samples]
        if not samplers:
            return []
        return sample(
            logits,
            [r.sampling_params.temperature for r in samplers],
            [r.sampling_params.top_k for r in samplers],
            [r.sampling_params.top_p for r in samplers],
            [r.generator for r in samplers],
        )

    def _update(self, scheduler_output: SchedulerOutput, sampled: list[int]) -> list[EngineCoreOutput]:
        outputs = []
        tokens = iter(sampled)
        for s in scheduler_output.scheduled:
            request = s.request
            samples = s.samples  # before the update below moves num_computed_tokens
            request.num_computed_tokens += s.num_new_tokens
            if not samples:
                continue
            request.all_token_ids.append(next(tokens))
            status = self._stop_status(s)
            if status is not None:
                self._finish(request, status)
            outputs.append(self._output(request))
        return outputs

    def _stop_status(self, s: ScheduledRequest) -> RequestStatus | None:
        request, params = s.request, s.request.sampling_params
        token = request.all_token_ids[-1]
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_token_ids):
            request.finish = FinishReason("stop", stop_token_id=token)
            return RequestStatus.FINISHED_STOPPED
        if request.num_output_tokens >= params.max_tokens or request.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _finish(self, request: Request, status: RequestStatus) -> None:
        self.scheduler.finish(request, status)
        if request.finish is None:
            request.finish = FinishReason(_FINISH_KIND[status])
        del self.requests[request.request_id]

    @staticmethod
    def _output(request: Request) -> EngineCoreOutput:
        finish = request.finish if request.status.is_finished else None
        return EngineCoreOutput(request.request_id, request.take_new_output_ids(), finish)

    def load_snapshot(self) -> LoadSnapshot:
        return LoadSnapshot(
            kv_used_blocks=self.kv_cache.num_used_blocks,
            kv_total_blocks=self.kv_cache.num_blocks,
            num_running_reqs=len(self.scheduler.running),
            num_waiting_reqs=len(self.scheduler.waiting),
            spec_decode=None,
        )
