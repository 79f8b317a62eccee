"""The format contract: what `prepare` writes and the trainer reads, with one owner each.

``shard_reader``/``shard_writer`` (the .bin/.idx pair), ``token_dtypes``, ``content_hash``,
``manifest`` (schema in manifests/schema.json, entries, load/write), ``verify`` (the one
verifier), ``atomic`` (durable writes) and ``errors``. Imports numpy, xxhash and the standard
library only, never another part of tokshard: a GPU node reads shards without the pipeline's
dependencies. Where files live (a local folder or an object store) is `pipeline.storage`'s.
"""
