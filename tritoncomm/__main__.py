"""``python -m tritoncomm ...``: the tools' command line (``tritoncomm.tools.cli``)."""

import sys

from .tools.cli import main

sys.exit(main())
