"""`python -m lmpipe_cli`: the `lmpipe` command, run from a checkout whose venv's script is not on PATH."""

import sys

from lmpipe_cli.main import main

sys.exit(main())
