"""`cortex_nb.run_spec` under its former name, so code written before the run spec got its name keeps importing it (the same
module object, not a copy)."""

import sys

from . import run_spec as _module

sys.modules[__name__] = _module
