"""MkDocs hooks: pages generated from the code at build time, so they cannot go stale.

``reference/configuration.md`` is written from the settings table
(:data:`ddl.base.config.SETTINGS`): every ``DDL_*`` variable, its ``ddlrun`` flag, its
default, whether ranks must agree on it at ``init``, and what it does.
``design/elastic-protocol.md`` is written from the elastic protocol module (every message
kind, its route and fields) and the state machines' transition tables, each with the
tier-1 tests that cover it (read from their ``@covers`` marks).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

PAGE = "reference/configuration.md"
PROTOCOL_PAGE = "design/elastic-protocol.md"
MACHINE_TESTS = Path(__file__).resolve().parents[1] / "tests" / "tier1" / "test_elastic_machines.py"


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


def covering_tests() -> dict[str, list[str]]:
    """Transition id -> the tests of test_elastic_machines.py marked ``@covers`` with it."""
    out: dict[str, list[str]] = {}
    for node in ast.parse(MACHINE_TESTS.read_text()).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            if isinstance(decorator, ast.Call) and getattr(decorator.func, "id", "") == "covers":
                for arg in decorator.args:
                    if isinstance(arg, ast.Constant):
                        out.setdefault(str(arg.value), []).append(node.name)
    return out


def protocol_page() -> str:
    """The elastic protocol and state machines as markdown."""
    from ddl.launcher.elastic import agent_machine, discovery, host, job_machine, world
    from ddl.runtime.elastic import protocol

    lines = [
        "# The elastic protocol",
        "",
        "Every message of an elastic job and every decision taken on them, generated from",
        "`ddl.runtime.elastic.protocol` and the state machines of `ddl.launcher.elastic` when the site",
        "is built. How a job recovers is told in [Elastic training](../guides/elastic.md#how-it-works).",
        "",
        f"## Messages (protocol version {protocol.VERSION})",
        "",
        "One JSON object a line, `{\"v\": VERSION, \"t\": kind, ...fields}`; a message of another version,",
        "an unknown kind, a missing, unknown or mistyped field, or one on the wrong route is refused",
        "with an error that says which (`ProtocolError`).",
        "",
        "| kind | class | route | fields | what it says |",
        "| --- | --- | --- | --- | --- |",
    ]
    for kind, cls in protocol.KINDS.items():
        fields = ", ".join(f"`{name}`: {kind_of}" for name, kind_of in protocol.fields_of(cls)) or "-"
        lines.append(f"| `{kind}` | `{cls.__name__}` | {cls.route.value} | {fields} | {cls.about} |")
    lines += ["", "Enumerated fields: " + "; ".join(
        f"`{e.__name__}` {', '.join(m.value for m in e)}" for e in (protocol.Step, protocol.Reason, protocol.EndCause,
                                                              protocol.StopWhy))
        + ".", ""]
    tests = covering_tests()
    for title, module, text in (
        ("A host, as ddlrun sees it", host, "`ddl.launcher.elastic.host`: the agent's start, connection, import "
                                            "and heartbeats."),
        ("A world", world, "`ddl.launcher.elastic.world`: its ranks' reports and ends."),
        ("The job between worlds", job_machine, "`ddl.launcher.elastic.job_machine`: when to start a world, what a closed one means."),
        ("A host's agent", agent_machine, "`ddl.launcher.elastic.agent_machine`: what the agent does with what "
                                          "ddlrun, the stubs and the ranks say."),
        ("Host discovery", discovery, "`ddl.launcher.elastic.discovery`: what each run of the discovery script "
                                      "(in a thread beside ddlrun's loop) means."),
    ):
        lines += [f"## {title}", "", text + " Tests: `tests/tier1/test_elastic_machines.py`.", "",
                  "| id | transition | covered by |", "| --- | --- | --- |"]
        for ident, what in module.TRANSITIONS.items():
            covered = ", ".join(f"`{t}`" for t in tests.get(ident, [])) or "**none**"
            lines.append(f"| {ident} | {what} | {covered} |")
        lines.append("")
    return "\n".join(lines)


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, PAGE, content=configuration_page()))
    files.append(File.generated(config, PROTOCOL_PAGE, content=protocol_page()))
    return files
