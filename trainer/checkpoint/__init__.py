"""DeepSpeed checkpoints that carry the trainer's data position, and resuming from them.

``state`` (the typed ``TrainerState`` record, the one place it turns into JSON; tags and the
``latest`` pointer), ``save`` (atomic publishing), ``resume`` (what a resume must keep,
checked before any process group exists) and ``load`` (into the engine, on any number of
ranks).
"""
