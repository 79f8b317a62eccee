"""Storage: where files live, on this machine or in an object store, behind one interface.

``locations`` (which strings are URLs), ``place`` (the `Place` interface), ``local_folder`` and
``object_store`` (its two implementations; fsspec only for a URL, imported on first use),
``places`` (a location string -> its `Place`, chosen once), ``ownership`` (whether a folder is
tokshard's to write), ``data_cache`` (a node's hash-checked copy of a manifest URL's shards) and
``verify_place`` (`tokshard verify` wherever the manifest is). Both the pipeline and the trainer
import it; it imports the format contract and the standard library (xxhash, fsspec lazily).
"""
