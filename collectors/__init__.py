"""Per-node agent: metric sources and the cluster simulator. Imports only ``minder.core``."""
