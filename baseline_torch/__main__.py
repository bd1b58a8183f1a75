"""`python -m baseline_torch` is `python -m baseline_torch.train`."""

import sys

from baseline_torch.train import main

sys.exit(main())
