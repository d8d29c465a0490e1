"""One rank of a labkit job: ``torchrun ... -m labkit.distributed {serve-batch,allreduce} ...``.

Start jobs with ``python -m labkit serve-batch`` / ``python -m labkit allreduce`` (the launcher),
which runs torchrun with this module and the environment every rank needs.
"""

import sys

from torch.distributed.elastic.multiprocessing.errors import record  # torchrun's summary shows the error

from .cli import rank_main

if __name__ == "__main__":
    sys.exit(record(rank_main)(sys.argv[1:]))
