"""Secrets kept out of what whyidle stores and prints: command lines and text naming processes.

Standard library only: the in-process agent imports it inside the observed program (``proc``
``argv``). Applied where one of the job's command lines is recorded (``meta.json`` ``command``,
``proc`` ``argv``, ``host.jsonl`` ``host_proc`` ``cmdline``) and again when a run directory is
read (:func:`whyidle.record.reader.load_run`), so runs recorded before it are reported redacted
too. The command that runs is never changed; only whyidle's copies are. Processes outside the job
(``host_top``) keep no argument at all, only their program and script
(:func:`whyidle.cmdline.program_and_script`): these rules cannot see a secret passed bare.

The rules (sources: the variable and option names the major tools document for their secrets,
such as ``HF_TOKEN``, ``WANDB_API_KEY``, ``AWS_SECRET_ACCESS_KEY``, ``--hf-token``; and, for the
token shapes, the providers' documented prefixes, which secret scanners such as gitleaks match;
``docs/run-format.md`` repeats them):

1. **Secret-named values.** A name is secret-named when its last part (split on ``-``, ``_``
   and ``.``, lower-cased) ends with ``token``, ``key``, ``secret``, ``password``, ``passwd``,
   ``passphrase``, ``pwd``, ``auth``, ``credential(s)`` or ``cookie``: ``--hf-token``,
   ``--api_key``, ``--apiKey``, ``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``, ``db.password``,
   ``--http-auth``. Only the last part counts, since names that *start* with such a word qualify
   something else (``--token-limit``, ``--key-frames``, ``--password-file``, ``HF_TOKEN_PATH``:
   a path names where a secret is, not the secret), and ``tokenizer``/``--max-tokens`` are not
   ``token``. Whole names ``PWD``/``OLDPWD`` (the shell's working directory) and English words
   ending in ``key`` (``monkey``, ``hotkey``, ...) are not secret-named. The value of such a
   name is replaced by ``***``, the name kept: ``--hf-token ***``, ``--password=***``,
   ``HF_TOKEN=***`` (an environment assignment as ``env`` or a shell takes it, or a Hydra-style
   override ``+db.password=***``). Values kept: empty ones and booleans (``true``, ``false``,
   ``yes``, ``no``, ``on``, ``off``, ``none``, ``null``), which are never a secret
   (``--use-auth-token true``). Numbers are redacted: a name that ends in a secret word with a
   numeric value is a PIN or numeric password more often than a setting (settings such as
   ``--max-tokens 512`` are not secret-named in the first place). In the ``--name value`` form
   the next argument is the value unless it looks like an option (``-`` then a letter or ``-``),
   so a flag without a value (``--use-auth-token --model gpt2``) redacts nothing.
2. **Credentials in URLs.** ``scheme://user:password@host`` keeps the user and drops the
   password (``https://user:***@host``); a user part alone is kept unless it looks like a token
   (16 or more letters, digits, ``_`` or ``-``: ``https://***@github.com``).
3. **Known token shapes**, anywhere in any argument: Hugging Face ``hf_…``, OpenAI ``sk-…``,
   GitHub ``ghp_/gho_/ghs_/ghu_/ghr_…`` and ``github_pat_…``, AWS access key ids
   ``AKIA…``/``ASIA…``, Slack ``xox[abposr]-…``, JWTs ``eyJ….….…`` and ``Bearer …``; the
   prefix is kept (``hf_***``) so the report still says what was there.
4. **Shell strings.** The argument after ``-c`` (``bash -c "HF_TOKEN=x python t.py --api-key
   K"``, ``python -c "login(token='x')"``) is redacted word by word with the same rules, plus
   JSON-style ``"api_key": "x"`` pairs. Elsewhere an argument ``NAME=value`` that holds spaces
   loses its whole value (``env PASSWORD="a b" cmd`` gives one argument ``PASSWORD=a b``).

Not caught: secrets whose name says nothing (``--db-uri x``), glued short options
(``mysql -pSECRET``), a value starting with ``-`` after a secret-named option. Redaction is
idempotent: redacting twice gives the same as once.
"""

from __future__ import annotations

import re

#: What replaces a secret.
MARK = "***"

#: Endings of a name's last part that make it secret-named (rule 1).
SECRET_ENDINGS = ("token", "key", "secret", "password", "passwd", "passphrase", "pwd", "auth",
                  "credential", "credentials", "cookie", "cookies")
#: Last parts that end like a secret word but are not one (rule 1).
NOT_SECRET = frozenset({"monkey", "donkey", "turkey", "hockey", "jockey", "whiskey", "hotkey", "lackey"})
#: Whole names that end like a secret word but are not one: the shell's working directories.
NOT_SECRET_NAMES = frozenset({"pwd", "oldpwd"})
#: Values left in place after a secret name (rule 1).
HARMLESS = frozenset({"", "true", "false", "yes", "no", "on", "off", "none", "null"})

_NAME = r"[A-Za-z_][\w.\-]*"
#: One shell word of a value: quoted parts, escapes and unquoted characters up to a separator.
_VALUE = r"""(?:"(?:\\.|[^"\\])*"|'[^']*'|\\.|[^\s"'\\;&|<>()`])+"""
_ASSIGN = re.compile(rf"^((?:--?|\+{{1,2}}|~)?{_NAME})=(.*)$", re.DOTALL)
_OPTION = re.compile(rf"^--?{_NAME}$")
#: The option before a shell string or program text: ``-c`` (``sh``, ``bash``, ``python``), alone or
#: last in a cluster (``bash -lc``, ``sh -ec``).
_SHELL_FLAG = re.compile(r"-[A-Za-z]*c")
_TEXT_ASSIGN = re.compile(rf"(?<![\w.\-+~])((?:--?|\+{{1,2}}|~)?{_NAME})=({_VALUE})")
_TEXT_OPTION = re.compile(rf"(?<!\S)(--?{_NAME})(\s+)((?![-\s]){_VALUE})")
_TEXT_JSON = re.compile(r"""(["'])([A-Za-z_][\w.\-]*)\1(\s*:\s*)("(?:\\.|[^"\\])*"|'[^']*')""")
_URL_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)([^/\s:@?#]*)(?::([^/\s?#]*))?@")
_TOKEN_LIKE_USER = re.compile(r"[\w\-]{16,}")
#: (pattern, prefix kept) of known token shapes (rule 3).
_SHAPES = [re.compile(p) for p in (
    r"\b(hf_)[A-Za-z0-9]{20,}",
    r"\b(sk-)(?:[A-Za-z0-9_\-]{20,})",
    r"\b(gh[pousr]_)[A-Za-z0-9]{20,}",
    r"\b(github_pat_)[A-Za-z0-9_]{20,}",
    r"\b((?:AKIA|ASIA))[A-Z0-9]{16}\b",
    r"\b(xox[abposr]-)[A-Za-z0-9\-]{10,}",
    r"\b(eyJ)[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*",
    r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=\-]{8,}",
)]


def is_secret_name(name: str) -> bool:
    """Whether ``name`` (an option such as ``--hf-token``, a variable such as ``HF_TOKEN``, a
    Hydra key such as ``+db.password``) names a secret, by rule 1 of this module's docstring."""
    bare = name.lstrip("-+~")
    if bare.lower() in NOT_SECRET_NAMES:
        return False
    parts = [p for p in re.split(r"[-_.]", bare) if p]
    if not parts:
        return False
    last = parts[-1].lower()
    return last not in NOT_SECRET and last.endswith(SECRET_ENDINGS)


def _harmless(value: str) -> bool:
    bare = value.strip("'\"")
    return bare.lower() in HARMLESS or bare == MARK


def _shapes(text: str) -> str:
    for pattern in _SHAPES:
        text = pattern.sub(lambda m: m.group(1) + MARK, text)
    return text


def _url(m: re.Match) -> str:
    scheme, user, password = m.group(1), m.group(2), m.group(3)
    if password is not None:
        return f"{scheme}{user}:{MARK if password else ''}@"
    return f"{scheme}{MARK if _TOKEN_LIKE_USER.fullmatch(user) else user}@"


def redact_text(text: str) -> str:
    """``text`` (a shell string, a command line joined with spaces, a sentence naming a process)
    with secrets replaced by ``***``: secret-named ``NAME=value``, ``--name=value`` and
    ``--name value`` words, JSON-style ``"name": "value"`` pairs, URL passwords and known token
    shapes (rules 1–4 of this module's docstring).

    Args:
        text: any string; non-strings are returned unchanged.
    Returns:
        the redacted string (``text`` itself when nothing matched).
    """
    if not isinstance(text, str) or not text:
        return text
    text = _URL_USERINFO.sub(_url, text)
    text = _shapes(text)
    text = _TEXT_ASSIGN.sub(lambda m: m.group(0) if not is_secret_name(m.group(1)) or _harmless(m.group(2))
                            else f"{m.group(1)}={MARK}", text)
    text = _TEXT_OPTION.sub(lambda m: m.group(0) if not is_secret_name(m.group(1)) or _harmless(m.group(3))
                            else f"{m.group(1)}{m.group(2)}{MARK}", text)
    return _TEXT_JSON.sub(lambda m: m.group(0) if not is_secret_name(m.group(2)) or _harmless(m.group(4))
                          else f"{m.group(1)}{m.group(2)}{m.group(1)}{m.group(3)}\"{MARK}\"", text)


def _looks_like_option(arg: str) -> bool:
    return len(arg) > 1 and arg[0] == "-" and (arg[1].isalpha() or arg[1] == "-")


def redact_argv(argv: list[str]) -> list[str]:
    """A copy of a command line with secrets replaced by ``***`` (rules 1–4 of this module's
    docstring): ``["python", "t.py", "--hf-token", "***", "--password=***"]``.

    Args:
        argv: the command line, one argument per item (non-string items are kept as they are).
    Returns:
        a new list of the same length; arguments without secrets are unchanged.
    """
    out = []
    secret_next = False
    for i, arg in enumerate(argv):
        if not isinstance(arg, str):
            out.append(arg)
            secret_next = False
            continue
        if secret_next and not _looks_like_option(arg):
            out.append(arg if _harmless(arg) else MARK)
            secret_next = False
            continue
        secret_next = False
        m = _ASSIGN.match(arg)
        if i > 0 and isinstance(argv[i - 1], str) and _SHELL_FLAG.fullmatch(argv[i - 1]):
            out.append(redact_text(arg))
        elif m and is_secret_name(m.group(1)):
            out.append(arg if _harmless(m.group(2)) else f"{m.group(1)}={MARK}")
        else:
            if _OPTION.match(arg) and is_secret_name(arg):
                secret_next = True
            out.append(redact_text(arg))
    return out
