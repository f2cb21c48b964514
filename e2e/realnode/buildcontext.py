"""The content key of an image's build inputs, so an unchanged image is never rebuilt (issue 16).

Where it sits: pure (reads files, runs nothing), used by
``e2e.realnode.imagebuild``. A key is the SHA-256 of everything a build of
``docker/<name>.Dockerfile`` reads: the Dockerfile, its ``.dockerignore``,
the build arguments, the base image's ID and every file of the build
context that the ``.dockerignore`` lets through (path, executable bit,
bytes). The image is pushed tagged by the key; when the registry already
serves that tag, building and pushing again would produce the same image,
so both are skipped (buildah's own layer cache still hashes a multi-GB
venv to find out, which is what made a no-change rebuild take 41 s).

The ``.dockerignore`` is read with Docker's rules as far as the project's
files use them (``*``, ``?``, ``**``, ``!`` re-includes, the last matching
line wins, a match on a parent directory counts); anything else (character
classes, escapes) is refused rather than guessed, so the key never covers
fewer files than the build sees.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

_UNSUPPORTED = re.compile(r"[\[\]\\]")


class IgnoreFileError(ValueError):
    """A ``.dockerignore`` line this reader does not understand."""


@dataclasses.dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    include: bool  # a "!" line
    literal_prefix: str  # the pattern up to its first wildcard, for pruning the walk


def _regex(pattern: str) -> re.Pattern[str]:
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append(r"(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(r".*")
            i += 2
        elif pattern[i] == "*":
            out.append(r"[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append(r"[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def parse_ignore(text: str) -> list[Rule]:
    """The rules of a ``.dockerignore`` in file order."""
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        pattern = os.path.normpath(line.removeprefix("!").strip()).lstrip("/")
        if _UNSUPPORTED.search(pattern):
            raise IgnoreFileError(f"unsupported .dockerignore line: {raw!r}")
        prefix = re.split(r"[*?]", pattern, maxsplit=1)[0]
        rules.append(Rule(_regex(pattern), include, prefix))
    return rules


def included(rel: str, rules: list[Rule]) -> bool:
    """Whether ``rel`` (a path relative to the context, '/'-separated) is sent to the build:
    the last rule matching it or one of its parent directories decides."""
    parts = rel.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    keep = True
    for rule in rules:
        if any(rule.pattern.match(c) for c in candidates):
            keep = rule.include
    return keep


def _may_hold_included(rel_dir: str, rules: list[Rule]) -> bool:
    """An excluded directory is still walked when a "!" line could re-include something in it."""
    for rule in rules:
        if not rule.include:
            continue
        prefix = rule.literal_prefix
        if not prefix or prefix.startswith(rel_dir + "/") or rel_dir.startswith(prefix):
            return True
    return False


def context_files(root: Path, rules: list[Rule]) -> Iterator[str]:
    """Relative paths of the files (and symlinks) the build context holds, sorted."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        kept = []
        for d in sorted(dirnames):
            rel = f"{rel_dir}/{d}" if rel_dir else d
            if os.path.islink(os.path.join(dirpath, d)):
                filenames.append(d)  # a link is an entry of its own, never followed
            elif included(rel, rules) or _may_hold_included(rel, rules):
                kept.append(d)
        dirnames[:] = kept
        for f in filenames:
            rel = f"{rel_dir}/{f}" if rel_dir else f
            if included(rel, rules):
                found.append(rel)
    return iter(sorted(found))


def context_key(
    root: Path,
    dockerfile: Path,
    ignorefile: Path,
    build_args: Mapping[str, str],
    base_id: str,
) -> str:
    """SHA-256 (hex) of every input of one build."""
    h = hashlib.sha256()

    def put(label: str, data: bytes) -> None:
        h.update(f"{label}\0{len(data)}\0".encode())
        h.update(data)

    put("dockerfile", dockerfile.read_bytes())
    ignore = ignorefile.read_bytes()
    put("dockerignore", ignore)
    for key in sorted(build_args):
        put(f"arg:{key}", build_args[key].encode())
    put("base", base_id.encode())
    for rel in context_files(root, parse_ignore(ignore.decode())):
        path = root / rel
        if path.is_symlink():
            put(f"link:{rel}", os.readlink(path).encode())
        else:
            mode = "x" if os.access(path, os.X_OK) else "-"
            put(f"file:{mode}:{rel}", path.read_bytes())
    return h.hexdigest()
