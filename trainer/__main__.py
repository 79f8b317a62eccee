"""``python -m trainer``, ``deepspeed --module trainer``, ``torchrun -m trainer``: tokshard train."""

from __future__ import annotations

import sys

from pipeline.format.errors import TokshardError


def run() -> int:
    from trainer.cli import main

    try:
        return main(sys.argv[1:])
    except TokshardError as exc:
        print(f"tokshard: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(run())
