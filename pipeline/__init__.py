"""tokshard's CPU side: sources -> tokenizer -> encoder -> shard writer -> manifest.

Kept import-free so that `pipeline.shard_reader` and `pipeline.manifest` load on a GPU node
with numpy and the standard library alone.
"""

__version__ = "0.1.0"
