"""``python -m tokshard``: the `tokshard` command."""

import sys

from tokshard.cli import main

sys.exit(main())
