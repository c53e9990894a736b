"""whyidle bootstrap, imported by Python at start-up in every process of an observed command.

``whyidle run`` puts this file's directory first on ``PYTHONPATH``. It starts the in-process
agent, then takes its directory off ``sys.path`` and imports the ``sitecustomize`` it shadows (if
any), so the user's own start-up customization still runs. Errors never stop the program.
"""

import os
import sys


def _whyidle_bootstrap() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        from whyidle.instrument import agent

        agent.start_from_env()
    except Exception as exc:
        try:
            sys.stderr.write(f"[whyidle] instrumentation disabled: {exc!r}\n")
        except Exception:
            pass
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    shadowing = sys.modules.pop("sitecustomize", None)
    try:
        import importlib

        importlib.import_module("sitecustomize")
    except ModuleNotFoundError as exc:
        if exc.name != "sitecustomize":
            raise
        if shadowing is not None:
            sys.modules["sitecustomize"] = shadowing


_whyidle_bootstrap()
del _whyidle_bootstrap
