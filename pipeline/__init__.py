"""tokshard's CPU side: sources -> tokenizer -> encoder -> shard writer -> manifest.

Kept import-free so that `pipeline.format.shard_reader` and `pipeline.format.manifest` load on a GPU node
with numpy and the standard library alone.
"""

__version__ = "0.1.0"
