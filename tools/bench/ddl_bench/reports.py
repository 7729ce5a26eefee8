"""Where a benchmark's report goes: its table on stdout, its JSON in the output folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def publish(report: dict[str, Any], table: str, out: str | Path, name: str) -> Path:
    """Print ``table``, write ``report`` as ``out/name`` (the folder made if missing), say where;
    returns the folder (for plots beside the JSON)."""
    print(table)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(report, indent=2))
    print(f"wrote {folder / name}")
    return folder
