"""``python -m zhie ...`` (and ``torchrun ... -m zhie ...``): the ``zhie`` command."""

import sys

from zhie.cli import main

sys.exit(main())
