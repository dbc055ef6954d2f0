"""pytest-benchmark suites (run with `make bench`; they are skipped as timing
in the normal test run, which passes --benchmark-disable)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
