"""`python -m kernels_nki.emulator`: the emulator's rule table (kernels_nki.emulator.rules's command line; a module
the package imports itself cannot be run with -m without runpy's warning)."""

import sys

from kernels_nki.emulator.rules import main

if __name__ == "__main__":
    sys.exit(main())
