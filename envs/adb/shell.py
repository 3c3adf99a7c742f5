"""A small POSIX-like shell for the emulated device: just enough `sh` to make quoting matter.

It interprets what a real device shell would: `;`, `&&`, `||` and newlines separate commands, `$?` expands,
backticks and `$(...)` run command substitutions, single quotes are literal, double quotes keep `$` live.
So an argument that reaches it unquoted really would run `rm`: the emulated device logs every command it
executes (`DeviceShell.executed`), which is how the injection tests prove that hostile data stays data.
"""
from __future__ import annotations

from typing import Callable

Runner = Callable[[list[str]], tuple[str, int]]  # argv -> (output, exit status)

_OPS = (";", "&&", "||", "\n", "|", "&")


class ShellSyntaxError(ValueError):
    """The command line does not parse (an unterminated quote or substitution)."""


def _find_close_paren(s: str, i: int) -> int:
    """Index of the `)` closing a `$(` whose body starts at `i` (quotes inside are honoured)."""
    depth, q = 1, ""
    while i < len(s):
        c = s[i]
        if q:
            if c == q:
                q = ""
            elif c == "\\" and q == '"':
                i += 1
        elif c in "'\"":
            q = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ShellSyntaxError("unterminated $(")


def run_line(line: str, runner: Runner, status: int = 0) -> tuple[str, int]:
    """Run a command line: split into words and operators, expand, execute in order; (output, status)."""
    out: list[str] = []
    words: list[str] = []
    cur: list[str] | None = None  # the word being built (None between words)
    pending_op = ";"
    i, n = 0, len(line)

    def subst(body: str) -> str:
        nonlocal status
        text, status = run_line(body, runner, status)
        return text.rstrip("\n")

    def flush_command(op: str) -> None:
        nonlocal words, cur, status, pending_op
        if cur is not None:
            words.append("".join(cur))
            cur = None
        run = words and (pending_op in (";", "\n", "|", "&") or (pending_op == "&&" and status == 0)
                         or (pending_op == "||" and status != 0))
        if run:
            text, status = runner(words)
            out.append(text)
        words = []
        pending_op = op

    while i < n:
        c = line[i]
        if c == "'":
            j = line.find("'", i + 1)
            if j < 0:
                raise ShellSyntaxError("unterminated single quote")
            cur = (cur or []) + [line[i + 1:j]]
            i = j + 1
        elif c == '"':
            i += 1
            buf: list[str] = []
            while True:
                if i >= n:
                    raise ShellSyntaxError("unterminated double quote")
                d = line[i]
                if d == '"':
                    i += 1
                    break
                if d == "\\" and i + 1 < n and line[i + 1] in '$`"\\\n':
                    buf.append(line[i + 1])
                    i += 2
                elif d == "$" and line.startswith("$?", i):
                    buf.append(str(status))
                    i += 2
                elif d == "$" and line.startswith("$(", i):
                    j = _find_close_paren(line, i + 2)
                    buf.append(subst(line[i + 2:j]))
                    i = j + 1
                elif d == "`":
                    j = line.find("`", i + 1)
                    if j < 0:
                        raise ShellSyntaxError("unterminated backtick")
                    buf.append(subst(line[i + 1:j]))
                    i = j + 1
                else:
                    buf.append(d)
                    i += 1
            cur = (cur or []) + ["".join(buf)]
        elif c == "\\" and i + 1 < n:
            cur = (cur or []) + ([] if line[i + 1] == "\n" else [line[i + 1]])
            i += 2
        elif c == "$" and line.startswith("$?", i):
            cur = (cur or []) + [str(status)]
            i += 2
        elif c == "$" and line.startswith("$(", i):
            j = _find_close_paren(line, i + 2)
            text = subst(line[i + 2:j])
            i = j + 1
            # unquoted substitution output is split into words, as sh does
            parts = text.split()
            if parts:
                cur = (cur or []) + [parts[0]]
                for p in parts[1:]:
                    words.append("".join(cur))
                    cur = [p]
        elif c == "`":
            j = line.find("`", i + 1)
            if j < 0:
                raise ShellSyntaxError("unterminated backtick")
            text = subst(line[i + 1:j])
            i = j + 1
            parts = text.split()
            if parts:
                cur = (cur or []) + [parts[0]]
                for p in parts[1:]:
                    words.append("".join(cur))
                    cur = [p]
        elif c in " \t":
            if cur is not None:
                words.append("".join(cur))
                cur = None
            i += 1
        elif c == "#" and cur is None:
            j = line.find("\n", i)
            i = n if j < 0 else j
        else:
            op = next((o for o in ("&&", "||") if line.startswith(o, i)), None) or (c if c in _OPS else None)
            if op is not None:
                flush_command(op)
                i += len(op)
            else:
                cur = (cur or []) + [c]
                i += 1
    flush_command(";")
    return "".join(out), status
