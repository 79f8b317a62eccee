"""The `tokshard` commands, one module each: its options beside its handler.

Each module ends with a ``COMMAND`` (`tokshard.commands.command.Command`): its name, summary,
example, ``add_options(parser)`` and ``run(args)``; ``tokshard/cli.py`` builds the parser from
them. Option defaults are stated where they are owned (the recipe's ``Settings``, the
trainer's ``trainer/settings.py``, the storage and demo modules) and shown in ``--help`` from
there. A module imports at load only what naming the command needs; what its options' help
reads from their owners is imported in ``add_options`` (only the command run builds its
options: describing ``train`` loads torch), and what the work needs in ``run``.
"""
