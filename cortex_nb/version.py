"""`cortex_nb.protocol.versions` under its former name, for one release (former_names.py)."""

from .former_names import keep_former_name
from .protocol import versions as _module

keep_former_name(__name__, _module)
