"""tokshard's GPU side: manifest -> memory-mapped windows -> sampler -> model -> DeepSpeed loop.

Modules: ``data`` (windows over shards, manifest guards), ``sampler`` (deterministic order and
mixture), ``prefetch`` (batches ahead of the loop), ``model``/``models`` (GPT sizes, Transformers),
``ds_config`` (DeepSpeed JSON), ``checkpoint`` (data position in checkpoints), ``loop``,
``metrics`` (metrics.jsonl), ``cli`` (``tokshard train``), ``schedule`` (the mixture as segments,
so a resume may change it), ``docmask`` (``--doc-mask``), ``api`` (the trainer's batches for any
PyTorch loop, no DeepSpeed), ``samples`` (``tokshard samples``), ``megatron``
(``tokshard megatron-args``).
"""
