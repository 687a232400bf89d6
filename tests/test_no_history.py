"""Code and docs say what is true and why; the history of how it came to be belongs to git. No
text file of the project points at a tracker's ticket by number."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLACES = (
    "vit",
    "tests",
    "configs",
    "docs",
    "benchmarks",
    "studies",
    "tools",
    "lab",
    "notebooks",
    "README.md",
)
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".ipynb", ".txt", ".html", ".toml"}
# Built from pieces, so that this file's own source does not match.
TICKET = re.compile(r"\b" + "iss" + r"ues? #?\d+", re.IGNORECASE)


def text_files():
    for place in PLACES:
        path = ROOT / place
        if path.is_file():
            yield path
        elif path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)


def test_no_ticket_numbers_in_code_and_docs():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in text_files()
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if TICKET.search(line)
    ]
    assert not found, "history belongs to git, not to code and docs:\n" + "\n".join(found)
