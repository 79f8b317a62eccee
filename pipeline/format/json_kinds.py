"""Which of the JSON files kept beside each other in LLM work a document is: one given for
another (a tokenizer.json as ``--manifest``, a manifest as ``--deepspeed``) is then named as
what it is, instead of failing on a field deep inside it."""

from __future__ import annotations

from typing import Any

MANIFEST = "a tokshard manifest"
TOKENIZER = "a tokenizer.json"
MODEL_CONFIG = "a model's config.json"
TOKENIZER_CONFIG = "a tokenizer_config.json"
DEEPSPEED_CONFIG = "a DeepSpeed config"
VOCABULARY = "a vocabulary (token -> id: a vocab.json or encoder.json)"

#: entries a vocabulary has at least (its byte alphabet alone is 256), where a config whose
#: settings are all numbers has a few dozen
VOCABULARY_MIN = 256
#: top-level keys only a DeepSpeed config has
DEEPSPEED_KEYS = frozenset(
    {
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "zero_optimization",
        "optimizer",
        "scheduler",
        "fp16",
        "bf16",
        "gradient_clipping",
        "steps_per_print",
    }
)


def kind_of(data: Any) -> str | None:
    """What a parsed JSON document is, by its shape (None: none of these). A vocabulary's keys
    are tokens, any word among them ("model", "format"), so each kind is told by the types of
    its fields, not their names alone."""
    if not isinstance(data, dict) or not data:
        return None
    if isinstance(data.get("shards"), list) or (
        isinstance(data.get("format"), int) and isinstance(data.get("tokenizer"), dict)
    ):
        return MANIFEST
    if isinstance(data.get("model"), dict) and isinstance(data.get("added_tokens"), list):
        return TOKENIZER
    if len(data) >= VOCABULARY_MIN and all(isinstance(value, int) for value in data.values()):
        return VOCABULARY
    if isinstance(data.get("model_type"), str) or isinstance(data.get("architectures"), list):
        return MODEL_CONFIG
    if "tokenizer_class" in data or "model_max_length" in data:
        return TOKENIZER_CONFIG
    if DEEPSPEED_KEYS & data.keys():
        return DEEPSPEED_CONFIG
    return None
