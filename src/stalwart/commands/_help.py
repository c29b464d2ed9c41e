"""Help layout shared by commands: options listed under their ``rich_help_panel`` headings.

The CLI prints click's plain help (``cli.py`` says why: rich's option table cut flags at 80
columns); typer lays panels out only in its rich help, so this command class does it for the
plain one."""

from __future__ import annotations

from typer.core import TyperCommand

_OTHER = "Options"  # options without a panel (--help) come last, under this heading


class PanelledCommand(TyperCommand):
    """A command whose help lists its arguments, then its options under their panels in the order
    the panels first appear among the parameters."""

    def format_options(self, ctx, formatter) -> None:
        args: list[tuple[str, str]] = []
        panels: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                args.append(record)
            else:
                panels.setdefault(getattr(param, "rich_help_panel", None) or _OTHER, []).append(record)
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        other = panels.pop(_OTHER, [])
        for heading, records in [*panels.items(), (_OTHER, other)]:
            if records:
                with formatter.section(heading):
                    formatter.write_dl(records)
