"""`cortex_nb.protocol.routes` under its former name, so code written before the contract moved keeps
importing it (the same module object, not a copy)."""

import sys

from .protocol import routes as _module

sys.modules[__name__] = _module
