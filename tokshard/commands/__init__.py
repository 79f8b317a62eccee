"""The `tokshard` commands that run on the trainer's side: ``train``, ``samples`` and
``megatron-args``, each module holding a command's options beside its handler (``main``).

They are the application layer over the trainer library (``trainer/``), which parses no
command line itself; ``trainer/__main__.py`` runs ``train`` for the launchers that start a
module by name (``deepspeed --module trainer``, ``torchrun -m trainer``).
"""
