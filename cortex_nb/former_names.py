"""Modules kept under the names they had before they moved (into `cortex_nb.protocol`, or renamed), for one
release: importing a former name gives the moved module itself (not a copy) and a DeprecationWarning that
names the new import. They go in the next release."""

from __future__ import annotations

import sys
import warnings
from types import ModuleType


def keep_former_name(former: str, module: ModuleType) -> None:
    """Make `former` (a module being imported) the very module `module`, warning whoever imports it."""
    warnings.warn(
        f"{former} is now {module.__name__}: import that; the name {former} goes in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    sys.modules[former] = module
