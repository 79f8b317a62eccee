"""``python -m tokshard``: the `tokshard` command, and what ``torch.distributed.run`` starts on
each rank of a multi-process `tokshard train`."""

import logging
import os
import sys

from tokshard.launch import main

status = main()
if os.environ.get("WORLD_SIZE", "1") != "1":
    # A rank of a multi-process run ends here, without the interpreter's teardown: its process
    # group is down (`trainer.distributed.finish`) and every file it wrote is closed and synced,
    # but at teardown the C++ threads torch and DeepSpeed leave behind can still abort the
    # process (SIGABRT, "terminate called without an active exception") after a run that
    # succeeded, which torch.distributed.run then reports as the run's failure.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
sys.exit(status)
