"""tokshard's application layer: the `tokshard` command line and the offline demo.

The one place that uses both sides: the CPU pipeline (``pipeline``) and the GPU trainer
(``trainer``), which never import each other except through the shard format contract
(``pipeline.format``). See docs/ARCHITECTURE.md.
"""
