"""tokshard's CPU side, one folder per stage: ``sources`` -> ``encoding`` -> ``run`` ->
``format`` (the shard and manifest contract the trainer shares); ``recipe`` holds the settings.

Kept import-free so that `pipeline.format` loads on a GPU node with numpy, xxhash and the
standard library alone (docs/ARCHITECTURE.md gives the import rule).
"""

__version__ = "0.3.0"
