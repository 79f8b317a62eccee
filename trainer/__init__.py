"""tokshard's GPU side: manifest -> memory-mapped windows -> sampler -> model -> DeepSpeed loop.

Modules: ``settings`` (a run's frozen settings, one record per component), ``plan`` (every
guard, and what is settled before the process group; ``guards`` holds the refusals that need
only settings and manifests), ``data`` (windows over shards, manifest guards), ``sampler``
(deterministic order and mixture), ``schedule`` (the mixture as segments, so a resume may
change it), ``prefetch`` (batches ahead of the loop), ``model``/``models`` (GPT sizes,
Transformers), ``docmask`` (``--doc-mask``), ``ds_config`` (DeepSpeed JSON, resolved once),
``engine`` (the DeepSpeed engine), ``checkpoint/`` (the trainer state in checkpoints: record,
save, resume checks, load), ``loop`` (the steps), ``evaluate``, ``metrics`` (metrics.jsonl),
``run_folders`` (``--save`` and the run folder), ``console`` (stdout, whose reader may quit),
``report``/``figures`` (``tokshard plot``),
``api`` (the trainer's batches for any PyTorch loop, no DeepSpeed), ``samples`` (which samples
a step trained on), ``megatron`` (Megatron-LM's data blend).
From ``pipeline/`` it imports the format contract (``pipeline.format``) and storage, nothing
else; it parses no command line (``tokshard/commands/`` does).
"""
