"""``python -m clustersim``: the command line."""

import sys

from clustersim.analysis.cli.main import main

sys.exit(main())
