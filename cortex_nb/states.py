"""`cortex_nb.protocol.states` under its former name, so code written before the contract moved keeps
importing it (the same module object, not a copy)."""

import sys

from .protocol import states as _module

sys.modules[__name__] = _module
