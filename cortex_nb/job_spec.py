"""`cortex_nb.run_spec` under its former name, for one release (former_names.py)."""

from . import run_spec as _module
from .former_names import keep_former_name

keep_former_name(__name__, _module)
