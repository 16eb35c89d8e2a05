"""Where token rows live: the DataPlane protocol and its implementations.

Import the implementations from their modules: ``eventlog.dataplane.memory`` (needs torch) and
``eventlog.dataplane.transferqueue`` (needs Ray and TransferQueue). This package itself imports
neither, so the ledger can name the protocol cheaply.
"""

from eventlog.dataplane.protocol import DataPlane, DataPlaneCheckpoint, Row, inventory_digest

__all__ = ["DataPlane", "DataPlaneCheckpoint", "Row", "inventory_digest"]
