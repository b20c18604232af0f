"""`python -m finetune_runtime <command>`: same entry point as the `ftjob-runtime` console script."""

import sys

from finetune_runtime.cli import main

sys.exit(main())
