"""cortex-nb's GPU-host service: jobs, workers, the LoRA engine, logs and metrics behind a REST API.

Importing this package is cheap: torch is imported only inside worker processes.
"""

from cortex_nb.protocol.versions import API_VERSION, __version__

__all__ = ["API_VERSION", "__version__"]
