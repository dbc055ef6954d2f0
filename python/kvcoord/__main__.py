"""``python -m kvcoord``: the ``kvcoord`` command."""

import sys

from kvcoord.cli import main

sys.exit(main())
