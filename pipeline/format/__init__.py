"""The format contract: what `prepare` writes and the trainer reads, with one owner each.

``shard_reader``/``shard_writer`` (the .bin/.idx pair), ``token_dtypes``, ``content_hash``,
``manifest`` (schema in manifests/schema.json, entries, load/write), ``verify`` (the one
verifier), ``atomic`` (durable writes), ``errors``, ``store`` (local path
or URL; object-store access) and ``store_cache`` (a node's hash-checked copy of a manifest URL).
Imports numpy, xxhash and the standard library only (fsspec too, but only inside ``store``'s
functions, when a path is a URL), never another part of tokshard.
"""
