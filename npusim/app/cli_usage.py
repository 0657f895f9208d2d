"""click's usage errors (an unknown option, a missing argument, a bad choice) as one `error:` line,
like every other error of npusim and zo, instead of click's usage block with its `Error:` line."""

from __future__ import annotations

import types

import click


def _one_line(e: click.UsageError, where: str) -> click.UsageError:
    if type(e).__name__ == "NoArgsIsHelpError":  # a bare `npusim`: its help, as asked
        return e
    def show(self, file=None):
        message = self.format_message().rstrip(".")
        click.echo(f"error: {where}: {message} (see {where} --help)", file=file, err=True)

    e.show = types.MethodType(show, e)
    return e


class OneLineGroup(click.Group):
    """A command group whose usage errors, its own and its commands', print one line (exit 2)."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as e:
            raise _one_line(e, e.ctx.command_path if e.ctx is not None else info_name or "") from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            if e.ctx is not None:
                where = e.ctx.command_path
            else:  # raised while the command's own context was being made
                where = " ".join(filter(None, (ctx.command_path, ctx.invoked_subcommand)))
            raise _one_line(e, where) from None
