"""MkDocs hooks (``mkdocs.yml``: ``hooks``): the CLI reference, generated from argparse.

A how-to page names its command with a marker, ``<!-- cli: train -->``, where the generated
usage line and options table go; ``<!-- cli-commands -->`` becomes the table of every command.
The parser is ``transduce.cli.build_parser()``, so the options on the site are the ones the
program takes: a new option appears by itself, and a command without a page (or a page for a
command that is gone) is a warning, which fails ``mkdocs build --strict``.

The figures BENCHMARKS.md links to (``bench/results/*.png``) are added to the site as they are,
so that the page that includes BENCHMARKS.md shows them without a copy in ``docs/``.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File

log = logging.getLogger("mkdocs.hooks.cli")
ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"<!-- cli: (?P<command>[a-z0-9 ]+) -->")
COMMANDS_MARKER = "<!-- cli-commands -->"
HOWTO = "how-to/"


def on_config(config):
    # Document this tree's code, not whichever transduce is installed (mkdocstrings: paths: [src]).
    sys.path.insert(0, str(ROOT / "src"))
    return config


def on_files(files, config):
    for png in sorted((ROOT / "bench" / "results").glob("*.png")):
        files.append(File(png.relative_to(ROOT).as_posix(), str(ROOT), config["site_dir"],
                          config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    parser = _parser()
    if COMMANDS_MARKER in markdown:
        markdown = markdown.replace(COMMANDS_MARKER, _commands_table(parser, page.file.src_uri))
    return MARKER.sub(lambda m: _command_reference(parser, m["command"]), markdown)


def on_nav(nav, config, files):
    """Every command has a how-to page (``how-to/COMMAND.md``), and every such page a command."""
    names = set(_subcommands(_parser()))
    pages = {f.src_uri[len(HOWTO):-3] for f in files.documentation_pages() if f.src_uri.startswith(HOWTO)}
    pages.discard("index")
    for name in sorted(names - pages):
        log.warning("transduce %s has no how-to page (docs/%s%s.md)", name, HOWTO, name)
    for name in sorted(pages - names):
        log.warning("docs/%s%s.md: transduce has no command %r", HOWTO, name, name)
    return nav


_PARSER = None


def _parser() -> argparse.ArgumentParser:
    global _PARSER
    if _PARSER is None:
        from transduce.cli import build_parser
        _PARSER = build_parser()
    return _PARSER


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """Each subcommand's parser and one-line help, in the order ``--help`` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return {name: (p, helps.get(name, "")) for name, p in action.choices.items()}
    return {}


def _commands_table(parser: argparse.ArgumentParser, src_uri: str) -> str:
    here = src_uri.rsplit("/", 1)[0] + "/" if "/" in src_uri else ""
    rows = ["| command | what it does |", "| --- | --- |"]
    for name, (_, help) in _subcommands(parser).items():
        link = f"{HOWTO}{name}.md"
        link = link[len(here):] if here and link.startswith(here) else link
        rows.append(f"| [`transduce {name}`]({link}) | {_cell(help)} |")
    return "\n".join(rows) + "\n\n" + _options_table(parser, "Options of `transduce` itself (before the command)")


def _command_reference(parser: argparse.ArgumentParser, command: str) -> str:
    """The usage line and options table of ``transduce COMMAND`` (and of its own subcommands)."""
    words = command.split()
    sub, help = parser, ""
    for word in words:
        commands = _subcommands(sub)
        if word not in commands:
            log.warning("<!-- cli: %s -->: transduce has no command %r", command, word)
            return f"`transduce {command}`: no such command"
        sub, help = commands[word]
    parts = [f"```text\n{sub.format_usage().strip()}\n```", f"*{_cell(help)}*" if help else "",
             _options_table(sub, "Options")]
    for name, (p, h) in _subcommands(sub).items():
        parts += [f"### `transduce {command} {name}`", f"```text\n{p.format_usage().strip()}\n```",
                  f"*{_cell(h)}*" if h else "", _options_table(p, "Options")]
    return "\n\n".join(x for x in parts if x) + "\n"


def _options_table(parser: argparse.ArgumentParser, title: str) -> str:
    rows = []
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = ", ".join(f"`{s}`" for s in a.option_strings) or f"`{a.metavar or a.dest}`"
        if a.option_strings and a.nargs != 0:
            name += f" `{_metavar(a)}`"
        rows.append(f"| {name} | {_cell(_help(a))} |")
    if not rows:
        return ""
    return f"**{title}**\n\n| option | meaning |\n| --- | --- |\n" + "\n".join(rows)


def _metavar(a: argparse.Action) -> str:
    if a.metavar:
        text = a.metavar if isinstance(a.metavar, str) else " ".join(a.metavar)
    elif a.choices:
        text = "{" + ",".join(map(str, a.choices)) + "}"
    else:
        text = a.dest.upper()
    return f"[{text}]" if a.nargs == "?" else text


def _help(a: argparse.Action) -> str:
    text = a.help % {**vars(a), "prog": "transduce"} if a.help else ""  # as argparse expands it
    if a.required and a.option_strings:
        text = f"(required) {text}"
    if not a.option_strings and a.nargs in ("?", "*"):
        text = f"(optional) {text}"
    if "default" not in text and a.default not in (None, False, [], argparse.SUPPRESS) and a.nargs != 0:
        text += f" (default: {a.default})"  # most helps say their default; this adds the rest
    return text


def _cell(text: str) -> str:
    """Text for a Markdown table cell: one line, and ``|``, ``*`` and ``<...>`` shown as they are."""
    text = " ".join(text.split()).replace("|", "\\|").replace("*", "\\*")
    return re.sub(r"<([^>]*)>", r"&lt;\1&gt;", text)
