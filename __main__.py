"""``python -m clustersim``: the command line."""

import sys

from clustersim.analysis.cli import main

sys.exit(main())
