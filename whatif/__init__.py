"""What-if straggler analysis of job traces. Imports only ``minder.core``."""
