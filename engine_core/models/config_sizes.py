"""The sizes every Qwen3-family config.json gives, a target's and a drafter's draft layers alike: positive
integers. Without torch: the launcher reads a drafter's config through ``drafter_values.py``."""

SIZE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
)
