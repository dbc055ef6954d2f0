"""``python -m kvcoord``: the ``kvcoord`` command."""

import sys

from kvcoord.cli import main

if __name__ == "__main__":  # not when a spawned worker re-imports the main module
    sys.exit(main())
