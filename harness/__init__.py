"""syncbn-harness: regression and bisection harness for SyncBatchNorm implementations."""

__version__ = "0.1.0"

# Version of the record format (harness.records); bump on any incompatible change.
SCHEMA_VERSION = 1
