"""Short names for command lines: a run's default name and the name of a process outside the job.

Standard library only, imported by the layers that launch a run (:mod:`whyidle.run.session`), that
sample the machine (:mod:`whyidle.sampling.host`), that read a run back (:mod:`whyidle.record.reader`)
and that compare runs (:mod:`whyidle.pipeline`), so it sits below all of them.

A process outside the observed job is named by its program and script only
(:func:`program_and_script`): its other arguments are someone else's and may hold a secret that no
rule recognizes (``sshpass -p SECRET``, ``mysql -pSECRET``, ``python - SECRET``), so they are never
kept. The job's own command lines are redacted instead (:mod:`whyidle.redact`).
"""

from __future__ import annotations

import os
import re

#: Launchers whose script names the run (torchrun and ``python -m torch.distributed.run``).
DIST_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")

#: Endings of an argument that is a script file (kept as its last path part by
#: :func:`program_and_script`); the name before it may hold only letters, digits, ``_``, ``-``,
#: ``.`` and ``+``, so a shell string or ``NAME=value`` that ends like a script is not one.
SCRIPT_FILE = re.compile(r"[\w.+\-]+\.(?:py|pyw|ipynb|sh|bash|zsh|js|mjs|cjs|ts|rb|pl|R|r|jl|lua|php|tcl)")
#: A module named after ``-m``: dotted identifiers.
_MODULE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
#: Python options whose value is the next argument (``python -W ignore t.py``).
_PY_VALUE_OPTIONS = frozenset({"-W", "-X", "-Q"})


def default_name(cmd: list[str]) -> str:
    """A short run name from the command: the script or module name (``train`` for
    ``python train.py``, ``pkg.train`` for ``python -m pkg.train``), else the program name. Under
    torchrun, the training script's name, with ``-node<N>`` when ``--node_rank``/``--node-rank``
    is given, so the node runs of one job get distinct directories."""
    base = os.path.basename(cmd[0])
    args = cmd[1:]
    if base.startswith("python"):
        for i, a in enumerate(args):
            if a == "-m" and i + 1 < len(args):
                if args[i + 1] in DIST_LAUNCHERS:
                    return _launched_name(args[i + 2:]) or args[i + 1]
                return args[i + 1]
            if a == "-c":
                return "python-c"
            if not a.startswith("-"):
                return os.path.splitext(os.path.basename(a))[0]
    if base == "torchrun":
        return _launched_name(args) or "torchrun"
    return os.path.splitext(base)[0] or "run"


def _launched_name(args: list[str]) -> str | None:
    """The script a torchrun command line trains (its first ``.py`` argument), ``-node<N>`` added."""
    script, node = None, None
    for i, a in enumerate(args):
        if a in ("--node_rank", "--node-rank") and i + 1 < len(args):
            node = args[i + 1]
        elif a.startswith(("--node_rank=", "--node-rank=")):
            node = a.split("=", 1)[1]
        elif a.endswith(".py") and script is None:
            script = os.path.splitext(os.path.basename(a))[0]
            break
    if script is None:
        return None
    return f"{script}-node{node}" if node is not None else script


def _program(argv0: str) -> str:
    """The program's name: the last path part of the first word of ``argv[0]`` (a process that
    rewrote its command line into one string, ``postgres: checkpointer``, keeps ``postgres``)."""
    words = argv0.split()
    first = words[0] if words else ""
    return os.path.basename(first.rstrip(os.sep)).rstrip(":")


def program_and_script(argv: list[str], name: str | None = None) -> str:
    """How a process outside the observed job is named: its program and, where it runs one, its
    script, and nothing else: ``python train.py`` (the script's last path part), ``python -m
    pkg.mod``, ``python -c`` (the program text dropped), ``bash run.sh``, ``torchrun train.py``,
    ``sshpass``, ``mysql``.

    The script is the first argument whose last path part is a file name ending like a script
    (:data:`SCRIPT_FILE`); Python's ``-m`` names its module, and ``-c`` or ``-`` (the program
    from standard input) end the search, since what follows is the program's own arguments. No
    other argument is ever kept, whatever it looks like.

    Args:
        argv: the process's command line (empty when unreadable: another user's process).
        name: its program name as the kernel knows it (psutil ``name()``), used when ``argv`` is
            empty or names nothing.
    Returns:
        the name, ``"?"`` when neither ``argv`` nor ``name`` gives one.
    """
    words = [a for a in argv if isinstance(a, str)]
    program = _program(words[0]) if words else ""
    if not program:
        return name or "?"
    python = program.startswith(("python", "pypy"))
    args = words[1:] if len(words[0].split()) <= 1 else words[0].split()[1:] + words[1:]
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if python and arg == "-m":
            module = args[i + 1] if i + 1 < len(args) else ""
            return f"{program} -m {module}" if _MODULE.fullmatch(module) else f"{program} -m"
        if arg in ("-c", "-") or (python and len(arg) > 2 and arg[0] == "-" and arg[1] != "-" and arg.endswith("c")
                                  and arg[1:].isalpha()):
            return f"{program} {'-' if arg == '-' else '-c'}"
        if python and arg in _PY_VALUE_OPTIONS:
            skip = True
            continue
        if arg.startswith("-"):
            continue
        base = os.path.basename(arg.rstrip(os.sep))
        if SCRIPT_FILE.fullmatch(base):
            return f"{program} {base}"
    return program
