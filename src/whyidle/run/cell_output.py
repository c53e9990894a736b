"""What a watched notebook cell shows in its output (``%%whyidle``, or ``whyidle.watch()`` run in a
Jupyter kernel): one live status line updated in place (``display_id``), then in its place the
report as the terminal shows it (rich text, with a plain-text copy), followed by the HTML report
inline: an ``<iframe srcdoc=...>`` holding the self-contained page (no server, no file URL:
JupyterLab, classic Notebook, VS Code), the page itself on Colab (whose outputs are their own
frames and drop a raw ``<iframe>``), and a plain-text line with the page's path where HTML is not
rendered. IPython is imported only when a cell output is made (inside a kernel).
"""

from __future__ import annotations

import base64
import gzip
import html
import io
import json
import os
import sys

#: Characters of the report's terminal view (the notebook's output area is about this wide).
REPORT_WIDTH = 100
#: Height in pixels of the inline HTML report's frame (it scrolls inside).
FRAME_HEIGHT_PX = 720


def in_kernel() -> bool:
    """True inside a Jupyter kernel (an IPython shell with a kernel: JupyterLab, Notebook, VS Code,
    Colab, nbclient), where a cell's output can show rich displays; False in a terminal IPython or
    a plain interpreter. Never raises."""
    ipython = sys.modules.get("IPython")
    try:
        shell = ipython.get_ipython() if ipython is not None else None
    except Exception:
        return False
    return shell is not None and getattr(shell, "kernel", None) is not None


class CellOutput:
    """The output of the running cell: made at the watch's start (in the cell's thread), updated from
    the live status thread, replaced by the report at the end."""

    def __init__(self) -> None:
        from IPython.display import display

        self._display = display
        self.handle = display({"text/plain": "[whyidle] starting…"}, raw=True, display_id=True)

    def live(self, text: str) -> None:
        """The status line now (any thread)."""
        self.handle.update({"text/plain": text}, raw=True)

    def show(self, report: dict | None, page: str | None, problem: str | None) -> None:
        """In place of the status line: the report's terminal view (or the ``problem`` line when
        there is no report); then the HTML report at ``page`` (a file path; None: none)."""
        if report is None:
            self.live(f"[whyidle] {problem or 'no report'}")
            return
        self.handle.update(terminal_bundle(report), raw=True)
        if page and os.path.exists(page):
            with open(page, encoding="utf-8") as f:
                self._display(inline_page(f.read(), page), raw=True)


def terminal_bundle(report: dict) -> dict:
    """The terminal view of ``report`` as a display bundle: ``text/html`` (rich's HTML export,
    colours inline) and ``text/plain``."""
    from rich.console import Console

    from whyidle.report import terminal

    console = Console(file=io.StringIO(), record=True, width=REPORT_WIDTH, highlight=False, soft_wrap=False,
                      force_terminal=False, force_jupyter=False)
    terminal.render(report, console=console)
    plain = console.export_text(clear=False)
    page = console.export_html(inline_styles=True, code_format="<pre style=\"font-family:monospace;"
                               "font-size:12px;line-height:1.35;white-space:pre\">{code}</pre>")
    return {"text/plain": plain, "text/html": page}


def inline_page(page: str, path: str) -> dict:
    """The HTML report ``page`` (self-contained) as a display bundle for the notebook's output.

    In an ``<iframe srcdoc>`` (its scripts and styles apart from the notebook's), the page
    gzip-compressed and base64-encoded (5.6 MB of escaped page → 2 MB in the notebook file),
    decompressed by the browser (``DecompressionStream``: Chromium ≥ 80, so VS Code, Firefox ≥ 113,
    Safari ≥ 16.4) and written into the frame; a browser without it shows where the page is. On
    Colab (whose outputs are frames of their own and drop a raw ``<iframe>``) the page itself.
    ``text/plain`` names ``path`` for front ends that render no HTML."""
    plain = f"whyidle HTML report: {path}"
    if "google.colab" in sys.modules:
        return {"text/html": page, "text/plain": plain}
    packed = base64.b64encode(gzip.compress(page.encode("utf-8"), 9)).decode("ascii")
    loader = (
        "<!doctype html><meta charset=utf-8><body><p id=whyidle-wait>whyidle report: loading…</p><script>"
        f"const packed='{packed}';"
        "(async()=>{try{const bytes=Uint8Array.from(atob(packed),c=>c.charCodeAt(0));"
        "const text=await new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'))).text();"
        "document.open();document.write(text);document.close();}catch(e){"
        f"document.getElementById('whyidle-wait').textContent={json.dumps('this browser cannot open the inline report: open ' + path)};"
        "}})();</script>")
    frame = (f'<iframe srcdoc="{html.escape(loader, quote=True)}" title="whyidle report" '
             f'style="width:100%;height:{FRAME_HEIGHT_PX}px;border:1px solid #ddd" '
             'sandbox="allow-scripts allow-popups allow-downloads"></iframe>')
    return {"text/html": frame, "text/plain": plain}
