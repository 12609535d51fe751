"""`python -m p4bs_cli ...`: the same as the `p4bs` command."""

import sys

from p4bs_cli.main import main

sys.exit(main())
