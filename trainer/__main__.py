"""``python -m trainer``, ``deepspeed --module trainer``, ``torchrun -m trainer``: `tokshard train`.

Launchers start a module by name, so the trainer's package carries this door; what it runs is
the application layer's ``train`` command (``tokshard/commands/train.py``), with the same
one-line errors as ``tokshard train``.
"""

from __future__ import annotations

import sys

from tokshard.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
