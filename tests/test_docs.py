"""The README and docs cannot drift from the code: the README's Python snippet runs, every command
line in its code blocks parses with today's options, and every relative link resolves."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from helpers import ROOT

README = ROOT / "README.md"
DOCS = [
    README,
    *sorted((ROOT / "docs").rglob("*.md")),
    ROOT / "benchmarks" / "README.md",
    ROOT / "tools" / "README.md",
    *sorted((ROOT / "studies").rglob("*.md")),
]


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.M | re.S)


def command_lines(text: str) -> list[list[str]]:
    """The vit-* command lines of the bash blocks, continuation lines joined, comments dropped."""
    commands = []
    for block in code_blocks(text, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0].startswith("vit-"):
                commands.append(words)
    return commands


def parse(words: list[str]) -> None:
    """Parse a command line as its command would, without running it: SystemExit(2) on an unknown
    option or a bad value. vit-train parses with --print_config (its LightningCLI then prints the
    resolved config and stops)."""
    from vit.commands import attention, eval, export, train

    command, args = words[0], words[1:]
    if command == "vit-train":
        return train.main([*args, "--print_config"])
    commands = {"vit-eval": eval.COMMAND, "vit-attention": attention.COMMAND, "vit-export": export.COMMAND}
    if command not in commands:
        raise AssertionError(f"no parser known for {command}")
    found = commands[command]
    if args[:1] and args[0] in found.subcommands:
        found, args = found.subcommands[args[0]], args[1:]
    found.parser().parse_args(args)


README_COMMANDS = command_lines(README.read_text())


def test_the_readme_has_command_lines_to_check():
    assert {words[0] for words in README_COMMANDS} == {"vit-train", "vit-eval", "vit-attention", "vit-export"}


@pytest.mark.parametrize("words", README_COMMANDS, ids=[" ".join(w)[:70] for w in README_COMMANDS])
def test_every_readme_command_line_parses(words, capsys):
    try:
        parse(words)
    except SystemExit as e:
        assert e.code in (0, None), f"{' '.join(words)}: {capsys.readouterr().err.strip()}"


def test_a_drifted_option_fails_the_check(capsys):
    """The check above would catch a README line whose option was renamed or removed."""
    for words in (
        ["vit-eval", "--ckpt", "best.ckpt", "--no-such-option"],
        ["vit-attention", "--ckpt", "best.ckpt", "--method", "rollout", "--no-such-option", "1"],
        [
            "vit-train",
            "fit",
            "--config",
            str(ROOT / "configs" / "two_circles.yaml"),
            "--model.vit.no_such",
            "1",
        ],
    ):
        with pytest.raises(SystemExit) as exit_info:
            parse(words)
        assert exit_info.value.code == 2
    assert "no-such-option" in capsys.readouterr().err


def test_the_readme_python_snippet_runs(tmp_path, monkeypatch):
    """The first Python block of the README builds a ViT, runs it and draws an attention map."""
    snippet = code_blocks(README.read_text(), "python")[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet, "README.md", "exec"), {})
    assert (tmp_path / "rollout.png").stat().st_size > 1000


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)  # not inside code blocks
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated heading numbered."""
    seen: dict[str, int] = {}
    for heading in re.findall(
        r"^#+ (.+)$", re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S), re.M
    ):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def dead_links(path: Path) -> list[str]:
    dead = []
    for target in relative_links(path):
        file, _, anchor = target.partition("#")
        where = path.parent / file
        if not where.exists() or (anchor and where.suffix == ".md" and anchor not in anchors(where)):
            dead.append(target)
    return dead


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_every_relative_link_resolves(path):
    assert dead_links(path) == []


def test_a_dead_link_fails_the_check(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A `b`: c\n")
    page.write_text(
        "[ok](there.md#a-b-c) [web](https://example.org) [gone](nowhere.md) [no anchor](there.md#d)\n"
        "```\n[code](x.md)\n```\n"
    )
    assert dead_links(page) == ["nowhere.md", "there.md#d"]


def parsers():
    from vit.commands import attention, chunks, eval, export

    found = {}
    for command in (eval.COMMAND, attention.COMMAND, export.COMMAND, chunks.COMMAND):
        found[command.prog] = command.parser()
        found |= {sub.prog: sub.parser() for sub in command.subcommands.values()}
    return found


def test_every_option_is_shown_one_way_and_read_both_ways():
    """Options of several words are shown with underscores, as vit-train's are; the hyphenated
    spelling is read as the same option."""
    for name, parser in parsers().items():
        shown = re.findall(r"--[\w-]+", parser.format_help())
        assert not [o for o in shown if "-" in o[2:]], name
    parser = parsers()["vit-attention"]
    for args in (["--num_images", "3", "--query_patch", "1,2"], ["--num-images", "3", "--query-patch=1,2"]):
        options = parser.parse_args(["--ckpt", "x.ckpt", *args])
        assert (options.num_images, options.query_patch) == (3, "1,2")


# Every figure of a study comes from a committed output: a marked table or paragraph (or list)
# names its files,
#   <!-- figures: ../studies/heads/outputs/demo_heads.txt ../studies/heads/outputs/demo_heads.json -->
# (paths from the page's folder) on the line before it, and each decimal number in the block must
# be printed in one of the text files, or be a value of one of the JSON files at the shown precision
# (or a share times 100: "points", either sign: "costs 11.2 points" for a change of -0.112).
MARKER = re.compile(r"^<!-- figures: (.+?) -->\n((?:[^\n#<][^\n]*\n)+)", re.MULTILINE)
FULLY_MARKED = ["heads.md"]  # pages whose every figure stands in a marked block
DECIMAL = re.compile(r"(?<![\w.])[-+−]?\d+\.\d+")


def json_values(value) -> list[float]:
    if isinstance(value, dict):
        return [v for item in value.values() for v in json_values(item)]
    if isinstance(value, list):
        return [v for item in value for v in json_values(item)]
    return [float(value)] if isinstance(value, int | float) and not isinstance(value, bool) else []


def unsourced(table: str, sources: list[Path]) -> list[str]:
    """The decimal numbers of a markdown table that no source holds."""
    import json

    printed, values = "", []
    for source in sources:
        text = source.read_text()
        printed += text
        if source.suffix == ".json":
            values += json_values(json.loads(text))
    printed_numbers = {float(n.replace("−", "-")) for n in DECIMAL.findall(printed)}
    values += list(printed_numbers)  # a printed share may be shown as points too
    missing = []
    for number in DECIMAL.findall(table):
        shown = float(number.replace("−", "-"))
        places = len(number.split(".")[1])
        found = shown in printed_numbers or any(
            round(v, places) == shown or abs(round(100 * v, places)) == abs(shown) for v in values
        )
        if not found and shown != 0:
            missing.append(number)
    return missing


MARKED = [(page, m) for page in DOCS for m in MARKER.finditer(page.read_text())]


def test_the_study_pages_mark_their_tables():
    pages = {page.name for page, _ in MARKED}
    assert {"heads.md", "explanations.md"} <= pages


@pytest.mark.parametrize(("page", "match"), MARKED, ids=[f"{p.name}:{m.start()}" for p, m in MARKED])
def test_every_figure_of_a_marked_table_is_in_its_committed_source(page, match):
    sources = [page.parent / name for name in match.group(1).split()]
    assert all(source.is_file() for source in sources), sources
    assert unsourced(match.group(2), sources) == []


@pytest.mark.parametrize("name", FULLY_MARKED)
def test_every_figure_of_a_study_page_stands_in_a_marked_block(name):
    """Outside code and marked blocks, a fully marked page holds no decimal number: a figure
    written into its prose without a source fails here."""
    text = re.sub(r"```.*?```", "", (ROOT / "docs" / name).read_text(), flags=re.DOTALL)
    assert DECIMAL.findall(MARKER.sub("", text)) == []


def test_a_figure_without_a_source_fails_the_check(tmp_path):
    (tmp_path / "out.json").write_text('{"accuracy": 0.9123, "loss": [0.25]}')
    (tmp_path / "out.txt").write_text("head 2: 0.716 [0.659, 0.770]\n")
    table = "| a | b |\n|---|---|\n| 0.912 | 91.2 points | 0.716 [0.659, 0.770] | 0.25 | 71.6 |\n"
    assert unsourced(table, [tmp_path / "out.json", tmp_path / "out.txt"]) == []
    assert unsourced("| 0.913 | 0.717 |\n", [tmp_path / "out.json", tmp_path / "out.txt"]) == [
        "0.913",
        "0.717",
    ]


# A dotted name the docs give (vit.interpret.head_analysis.analyse, vit.config.PRESETS) must import:
# a module moved or a name renamed fails here, not in a reader's session. Option paths
# (--model.vit.depth) are not names: a dot, dash or word character before "vit" leaves them out;
# so do file names (vit.json).
DOTTED = re.compile(r"(?<![\w.\-/])vit(?:\.[A-Za-z_]\w*)+")
FILES = (".json", ".yaml", ".png", ".html", ".txt", ".csv", ".ckpt")
NAMED = sorted(
    {m.group(0) for page in DOCS for m in DOTTED.finditer(page.read_text()) if not m.group(0).endswith(FILES)}
)


def resolves(name: str) -> bool:
    """Whether `name` imports: its longest module prefix, then attributes."""
    import importlib

    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attribute in parts[cut:]:
                found = getattr(found, attribute)
        except AttributeError:
            return False
        return True
    return False


def test_every_dotted_name_the_docs_give_imports():
    assert len(NAMED) > 10 and "vit.interpret.head_analysis.analyse" in NAMED
    assert [name for name in NAMED if not resolves(name)] == []
    assert not resolves("vit.model.PRESETS") and resolves("vit.config.PRESETS")


def test_the_layout_names_every_module():
    """docs/model.md's layout block names every module of the package (a module added or moved
    shows up there); vit/commands/ holds one module per command, named by it."""
    text = (ROOT / "docs" / "model.md").read_text()
    block = text[text.index("## Layout") :]
    block = block[: block.index("```", block.index("```") + 3)]
    modules = [
        p for p in (ROOT / "vit").rglob("*.py") if p.name != "__init__.py" and p.parent.name != "commands"
    ]
    missing = [str(p.relative_to(ROOT)) for p in modules if p.name not in block]
    assert len(modules) > 25 and not missing, missing
    for folder in ("vit/interpret/", "vit/commands/", "benchmarks/", "studies/", "tools/", "lab/"):
        assert folder in block, folder
