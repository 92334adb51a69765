"""`cortex_nb.demo_data` under its former name, for one release (former_names.py): the demo data is not the
datasets a backend stores (`Client.upload_dataset`)."""

from . import demo_data as _module
from .former_names import keep_former_name

keep_former_name(__name__, _module)
