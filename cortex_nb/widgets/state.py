"""`cortex_nb.job_state` under its former name, so code written before JobState left widgets/ keeps importing it (the same
module object, not a copy)."""

import sys

from .. import job_state as _module

sys.modules[__name__] = _module
