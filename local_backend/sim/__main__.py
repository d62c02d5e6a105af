"""``python -m local_backend.sim [flags]``: the simulator as a process (tests and benches spawn it)."""

import sys

from local_backend.sim._cli import main

sys.exit(main())
