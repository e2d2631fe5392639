"""`python3 -m engine.bench`: qwendesk-bench (engine/bench/suite.py)."""

import sys

from engine.bench.suite import main

sys.exit(main())
