"""A `prepare` run: ``driver`` (plan, submit, wait, manifest: one driver for every output) on
the scheduling side, ``worker_task`` (one partition, with commit points) on the Dask workers.
The run's state is behind one interface, ``run_state.RunState``, with two implementations:
``folder_state`` (a folder; its files and locks in ``folder_layout``) and ``store_state`` (an
object store: a lease, workers encode locally and upload whole partitions), chosen once by
``open_state``; ``records`` holds the typed records they keep (plan, checkpoint, holder).
``cluster`` (local, running or batch-job Dask), ``progress`` and ``status`` (what a person sees).
"""
