"""A prepared data directory's manifest (`manifest.json`, written last by `data.prepare`) and the marker a
preparation leaves while it writes (`.prepare-incomplete`).

Its own module so that the start-up loader (`dataset`) does not import the `data.prepare` CLI: `python -m
frontier_jax.data.prepare` then runs a module that is not already imported (no runpy RuntimeWarning).
"""

from __future__ import annotations

import json
from pathlib import Path

from frontier_jax.data.shards import DataError

MANIFEST = "manifest.json"
INCOMPLETE = ".prepare-incomplete"  # present while (or if a killed) prepare writes into the directory
MANIFEST_VERSION = 1


def read_manifest(out_dir) -> dict:
    """The manifest of a prepared directory; DataError if missing or unreadable."""
    path = Path(out_dir) / MANIFEST
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path}: no manifest (directory not prepared, or preparation did not finish)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: unreadable manifest ({e})") from None
