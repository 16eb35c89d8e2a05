"""Folders a data plane's checkpoint is saved in, made durably."""

from __future__ import annotations

import os
from pathlib import Path


def make_folder_durably(folder: Path) -> None:
    """`mkdir -p`, each new folder's entry fsynced in its parent: a checkpoint's folder made
    and not synced may be gone after a power cut while the CheckpointCommitted naming it
    stayed (DURABILITY §9: a save returns once its files are durable)."""
    missing: list[Path] = []
    at = folder
    while not at.exists():
        missing.append(at)
        at = at.parent
    folder.mkdir(parents=True, exist_ok=True)
    for made in reversed(missing):
        fsync_folder(made.parent)


def fsync_folder(folder: Path) -> None:
    """Make the folder's entries (files renamed or made in it) durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
