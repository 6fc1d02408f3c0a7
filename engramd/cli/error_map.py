"""The one place where the command line turns an exception into an ``error:`` line and an exit code.

Every command runs inside :class:`MappedGroup`, so whatever a command lets escape ends
the same way: one ``error:`` line on stderr naming what is wrong and where, never a
traceback.

    SocketRefusedError                               exit 4: this user may not, or must not, talk there
    DaemonUnavailableError (and DaemonAbsentError)   exit 3: nothing answers at the endpoint
    EngramError                                      exit 1: its message as written
    OSError                                          exit 1: the path and the system's reason
    ImportError of an optional package               exit 1: the extra to install (extras.py)
    click's usage errors                             exit 2: the command, what is wrong, where help is

A closed stdout (``| head``) ends the command quietly with 141.  ``sys.exit`` and Ctrl-C
pass through untouched.
"""
from __future__ import annotations

import errno
import os
import sys
from typing import Any, NoReturn

import click

from engram_client.core.errors import DaemonUnavailableError, EngramError, SocketRefusedError

from .extras import missing_extra_message

EXIT_FAILED, EXIT_NOT_READY, EXIT_UNREACHABLE = 1, 1, 3
EXIT_REFUSED = 4  # permission denied, or a socket another user could pose through: not "no daemon"
EXIT_BROKEN_PIPE = 141  # what a shell reports for a process ended by SIGPIPE


class CommandFailed(click.ClickException):
    """A command's failure, shown as one ``error:`` line with its own exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def fail(message: str, exit_code: int = EXIT_FAILED) -> NoReturn:
    raise CommandFailed(message, exit_code)


def describe_os_error(exc: OSError) -> str:
    """``PATH: reason`` with a hint for the reasons an operator can act on."""
    reason = exc.strerror or str(exc)
    hint = {errno.EROFS: " (the file system is mounted read-only)",
            errno.EACCES: " (this user may not write or read there)",
            errno.EPERM: " (this user may not do that there)",
            errno.ENOSPC: " (the file system is full)"}.get(exc.errno or 0, "")
    if exc.filename is None:
        return reason + hint
    where = exc.filename if exc.filename2 is None else f"{exc.filename} -> {exc.filename2}"
    return f"{where}: {reason}{hint}"


def _quiet_after_broken_pipe() -> NoReturn:
    """The reader went away (``engramd status | head -3``): stop quietly, as other tools do."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush finds nowhere to fail
    raise click.exceptions.Exit(EXIT_BROKEN_PIPE)


def exit_code_for(exc: EngramError) -> int:
    if isinstance(exc, SocketRefusedError):
        return EXIT_REFUSED
    return EXIT_UNREACHABLE if isinstance(exc, DaemonUnavailableError) else EXIT_FAILED


def one_line(exc: click.ClickException) -> str:
    """A click error as one ``error:`` line: click itself prints a usage error as three
    (the usage, a hint, the error), where scripts and logs expect one."""
    message = "; ".join(line.strip() for line in exc.format_message().splitlines() if line.strip()).rstrip(".")
    ctx = exc.ctx if isinstance(exc, click.UsageError) else None
    if ctx is None:
        return f"error: {message}"
    return f"error: {ctx.command_path}: {message} (see {ctx.command_path} --help)"


class MappedGroup(click.Group):
    """A click group whose commands' escaping exceptions become :class:`CommandFailed`,
    and whose every click error (usage errors included) ends as one ``error:`` line."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except click.ClickException as exc:
            click.echo(one_line(exc), err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        except click.exceptions.Exit as exc:  # raised outside a command: the quiet end after a closed pipe
            sys.exit(exc.exit_code)
        except BrokenPipeError:  # while click printed help or usage itself
            try:
                _quiet_after_broken_pipe()
            except click.exceptions.Exit as exc:
                sys.exit(exc.exit_code)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            command = self.get_command(ctx, ctx.invoked_subcommand) if ctx.invoked_subcommand else None
            if exc.ctx is None and command is not None:  # the option parser's errors carry no context
                exc.ctx = click.Context(command, info_name=ctx.invoked_subcommand, parent=ctx)
            raise
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except BrokenPipeError:
            _quiet_after_broken_pipe()
        except EngramError as exc:
            raise CommandFailed(str(exc), exit_code_for(exc)) from exc
        except OSError as exc:
            raise CommandFailed(describe_os_error(exc)) from exc
        except ImportError as exc:
            message = missing_extra_message(ctx.invoked_subcommand or "", exc.name or "")
            if message is None:
                raise
            raise CommandFailed(message) from exc
