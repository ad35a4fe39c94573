"""`python -m bench.economy`: the benchmark's command line (bench/economy/driver.py).

    .venv/bin/python -m bench.economy --quick --out /tmp/q
"""

import sys

from .driver import main

sys.exit(main())
