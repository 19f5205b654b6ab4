"""`python -m gpumond.cli …`: the `gpumond` command (tests, the Helm test helper and containers call it so)."""

import sys

from gpumond.cli import main

sys.exit(main())
