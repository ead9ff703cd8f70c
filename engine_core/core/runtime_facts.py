"""Facts an engine finds at start (from its runner and model), kept apart from the config it was given."""

from __future__ import annotations

from dataclasses import dataclass

from openinfer.engine_core.config import EngineConfig, check_kv_geometry
from openinfer.engine_core.worker.executor import ModelExecutor


@dataclass(frozen=True)
class RuntimeFacts:
    """Found once when the engine starts; never written back into :class:`EngineConfig`."""

    num_kv_blocks: int  # KV blocks the runner holds (--num-kv-blocks, or what --kv-cache-gb buys)
    block_size: int  # tokens per KV block
    max_model_len: int  # prompt + output limit: --max-model-len, else the model's max positions
    eos_token_ids: frozenset[int]  # the model's EOS ids (a request stops on one unless ignore_eos)
    vocab_size: int  # token ids are in [0, vocab_size)

    def __post_init__(self) -> None:
        check_kv_geometry(self.num_kv_blocks, self.block_size)
        if self.max_model_len < 2:
            raise ValueError(f"impossible engine facts: {self}")

    @classmethod
    def found(cls, config: EngineConfig, runner: ModelExecutor) -> RuntimeFacts:
        model = runner.model_config
        max_positions = model.max_position_embeddings
        if config.max_model_len is not None and config.max_model_len > max_positions:
            raise ValueError(  # vLLM refuses it too: positions past the model's were never trained
                f"--max-model-len {config.max_model_len} is greater than the model's "
                f"max_position_embeddings {max_positions}: give at most {max_positions}, or leave it out"
            )
        return cls(
            num_kv_blocks=runner.num_kv_blocks,
            block_size=runner.block_size,
            max_model_len=min(config.max_model_len or max_positions, max_positions),
            eos_token_ids=frozenset(model.eos_token_ids),
            vocab_size=model.vocab_size,
        )
