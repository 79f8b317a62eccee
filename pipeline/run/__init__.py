"""A `prepare` run: ``driver`` (plan, submit, wait, manifest) on the scheduling side,
``worker_task`` (one partition, with commit points) on the Dask workers, ``state`` (plan,
checkpoints and locks on disk), ``cluster`` (local, running or batch-job Dask), ``progress``
and ``status`` (what a person sees).
"""
