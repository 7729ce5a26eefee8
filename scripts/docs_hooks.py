"""MkDocs hooks: pages generated from the code at build time, so they cannot go stale.

``reference/configuration.md`` is written from the settings table
(:data:`ddl.base.config.SETTINGS`): every ``DDL_*`` variable, its ``ddlrun`` flag, its
default, whether ranks must agree on it at ``init``, and what it does.
"""

from __future__ import annotations

from typing import Any

from mkdocs.structure.files import File, Files

PAGE = "reference/configuration.md"


def configuration_page() -> str:
    """The configuration reference as markdown."""
    from ddl.base.config import SETTINGS
    from ddl.launcher.command import setting_help

    lines = [
        "# Configuration",
        "",
        "Every setting is a `DDL_*` environment variable, read once at `ddl.init()`; `ddlrun` sets the",
        "ones it has a flag for in every rank it starts (a flag wins over a variable already set). Blank",
        "means unset. Settings marked **agreed** change which MPI calls a rank makes: `init` compares",
        "them across ranks and refuses to start, naming the ranks and values, when they differ.",
        "",
        "This page is generated from the settings table (`ddl.base.config.Config`, whose fields declare",
        "each row) when the site is built.",
        "",
        "| variable | `ddlrun` flag | default | agreed | what it does |",
        "| --- | --- | --- | --- | --- |",
    ]
    for s in SETTINGS:
        flag = f"`{s.flag}`" if s.flag else ""
        agreed = "yes" if s.agreed else ""
        text = setting_help(s).replace("|", "\\|")
        lines.append(f"| `{s.env}` | {flag} | {s.default_text()} | {agreed} | {text} |")
    lines += ["", "Values of the wrong form stop `ddlrun` (exit 2) or `ddl.init()` with a message that names",
              "the variable and gives an example.", ""]
    return "\n".join(lines)


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, PAGE, content=configuration_page()))
    return files
