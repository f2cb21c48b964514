"""Downward API volume files, written at start and kept current as a kubelet does.

Where it sits: ``volumes.prepare`` writes a pod's downward API files when its
container starts, and ``agent.Kubelet`` calls ``volumes.refresh`` on every
update of a pod it runs, so a changed label or annotation reaches the files
(what a real kubelet's volume manager does on a pod update). What a pod's
files should hold and which ones differ from what is on disk are pure
functions (:func:`volume_files`, :func:`stale`), unit-tested on their own;
:func:`sync_dir` is the thin part that writes.

Each changed file is written to a temporary file in its own directory and
renamed over the old one, so a reader sees the old content or the new,
never a half-written file. (A real kubelet swaps a ``..data`` symlink over
a timestamped directory; this layout has plain files, and one rename per
file is atomic for the single-item files pods poll here.)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from e2e.kubelet.podspec import UnsupportedSpecError, metadata_field

_WHOLE_MAPS = ("metadata.labels", "metadata.annotations")


def item_value(pod: Mapping[str, Any], item: Mapping[str, Any]) -> str:
    """One downward API item's file content (``fieldRef`` on metadata only,
    as the API allows for volumes; ``resourceFieldRef`` is not supported)."""
    field = item.get("fieldRef", {}).get("fieldPath")
    if field is None:
        raise UnsupportedSpecError(f"downwardAPI item {item.get('path')!r} needs a fieldRef")
    if field in _WHOLE_MAPS:
        values = pod["metadata"].get(field.split(".")[1], {})
        return "\n".join(f'{k}="{v}"' for k, v in sorted(values.items()))
    value = metadata_field(pod, field)
    if value is None:
        raise UnsupportedSpecError(f"downwardAPI field {field!r} is not supported")
    return value


def volume_files(pod: Mapping[str, Any], vol: Mapping[str, Any]) -> dict[str, str]:
    """Path inside the volume -> content, for a ``downwardAPI`` volume's items
    or the ``downwardAPI`` sources of a ``projected`` one ({} for other kinds)."""
    if "downwardAPI" in vol:
        items = list(vol["downwardAPI"].get("items", []))
    else:
        sources = vol.get("projected", {}).get("sources", [])
        items = [i for s in sources for i in s.get("downwardAPI", {}).get("items", [])]
    return {str(i["path"]): item_value(pod, i) for i in items}


def stale(on_disk: Mapping[str, str | None], wanted: Mapping[str, str]) -> dict[str, str]:
    """The files to (re)write: each wanted one whose content on disk differs
    (None: the file is missing)."""
    return {path: text for path, text in wanted.items() if on_disk.get(path) != text}


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def sync_dir(target: Path, wanted: Mapping[str, str]) -> list[str]:
    """Bring the files of one volume directory to ``wanted``, each by an atomic
    rename; returns the paths rewritten."""
    changed = stale({path: _read(target / path) for path in wanted}, wanted)
    for rel, text in changed.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, path)
    return sorted(changed)
