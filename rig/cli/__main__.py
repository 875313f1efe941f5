"""``python -m rig.cli``: the ``pdrig`` command line (rig.cli.main)."""

import sys

from rig.cli import main

sys.exit(main())
