"""A `prepare` run: ``driver`` (plan, submit, wait, manifest) on the scheduling side,
``worker_task`` (one partition, with commit points) on the Dask workers, ``state`` (plan,
checkpoints and locks on disk), ``store_run`` (the same run into an object store: workers
encode locally and upload), ``cluster`` (local, running or batch-job Dask), ``progress`` and
``status`` (what a person sees).
"""
