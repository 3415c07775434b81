"""What a benchmark writes beside its rows: the date, the machine's versions and the command that ran it."""
from __future__ import annotations

import json
import sys
from datetime import date
from pathlib import Path
from typing import Any


def record(script: str, rows: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    """The rows of ``bench/<script>`` with today's date, ``fields`` (the device, say), the versions and the command."""
    from kernelevolve.machine import versions

    return {"date": date.today().isoformat(), **fields, **versions(),
            "command": f"python3 bench/{script} " + " ".join(sys.argv[1:]), "rows": rows}


def write(path: Path | None, data: dict[str, Any]) -> None:
    """``data`` as JSON at ``path`` (its folders made), where a path is given."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1) + "\n")
