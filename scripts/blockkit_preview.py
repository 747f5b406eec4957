"""Preview Block Kit as a person sees it: blocks -> a small HTML page in Slack's look (screenshot it with
headless Chromium). For reviews and screenshots only; Slack's own renderer is the truth. The screens
themselves (the App Home, a job thread, a chart) are scripts/slack_screens.py's, which imports this module:

    python -m scripts.slack_screens OUT_DIR     # from the repository's root: the screens, as PNGs

Renders header, section (text and fields), context, divider, actions (buttons), table (raw_text and
rich_text cells with user elements), image; mrkdwn *bold*, `code`, ```blocks```, <@U...> (shown as
@name), <#C...> and :emoji: shortcodes.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

EMOJI = {  # glyphs common fonts have (a headless machine rarely has a color emoji font)
    "zap": "⚡",
    "rocket": "➚",
    "warning": "⚠",
    "white_check_mark": "✔",
    "x": "✖",
    "hourglass": "⌛",
    "floppy_disk": "▣",
    "octagonal_sign": "■",
    "moneybag": "$",
    "bell": "♪",
    "bar_chart": "▤",
    "chart_with_downwards_trend": "↘",
    "wastebasket": "✖",
    "information_source": "ⓘ",
}
CSS = """
body { font-family: -apple-system, 'Segoe UI', 'DejaVu Sans', sans-serif; font-size: 15px; color: #1d1c1d;
       margin: 0; background: #fff; }
.pane { width: 880px; padding: 18px 24px; }
.bar { background: #3f0e40; color: #fff; padding: 10px 24px; font-weight: 700; font-size: 15px; }
.msg { display: flex; gap: 10px; margin: 10px 0 14px; }
.avatar { width: 36px; height: 36px; border-radius: 6px; background: #2c3e50; color: #fff; font-weight: 700;
          display: flex; align-items: center; justify-content: center; flex: none; }
.who { font-weight: 900; } .when { color: #616061; font-size: 12px; margin-left: 6px; }
.app { background: #e8e8e8; color: #616061; font-size: 10px; padding: 1px 3px; border-radius: 2px; }
h1 { font-size: 19px; margin: 6px 0 8px; }
.section { margin: 6px 0; line-height: 1.45; white-space: pre-wrap; }
.fields { display: grid; grid-template-columns: 1fr 1fr; gap: 6px 24px; margin: 8px 0; }
.fields > div, .section, .context { min-width: 0; overflow-wrap: anywhere; }
.context { color: #616061; font-size: 12.5px; margin: 6px 0; }
hr { border: none; border-top: 1px solid #dddddd; margin: 12px 0; }
.actions { margin: 8px 0; display: flex; gap: 8px; flex-wrap: wrap; }
.btn { border: 1px solid #c8c8c8; border-radius: 4px; padding: 4px 12px; font-weight: 700;
       font-size: 13.5px; }
.primary { background: #007a5a; color: #fff; border-color: #007a5a; }
.danger { color: #e01e5a; border-color: #e01e5a; }
code { background: #f6f6f6; border: 1px solid #e1e1e1; border-radius: 3px; color: #c01343; padding: 0 3px;
       font-size: 13px; }
.mention { background: #e8f5fa; color: #1264a3; border-radius: 3px; padding: 0 2px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13.5px; }
td { border: 1px solid #dddddd; padding: 5px 9px; }
tr:first-child td { background: #f8f8f8; }
.thread { border-left: 3px solid #dddddd; margin-left: 46px; padding-left: 12px; }
img.chart { max-width: 100%; border: 1px solid #e1e1e1; border-radius: 6px; margin-top: 6px; }
"""


def mrkdwn(text: str, names: Callable[[str], str]) -> str:
    """Slack's mrkdwn (our subset) as HTML; the text is already Slack-escaped (&amp; &lt; &gt;)."""
    text = re.sub(r"```(.*?)```", lambda m: f"<code>{m.group(1)}</code>", text, flags=re.S)
    text = re.sub(
        r"&lt;@([UW][A-Z0-9_]+)(?:\|[^&]*)?&gt;|<@([UW][A-Z0-9_]+)(?:\|[^>]*)?>",
        lambda m: f'<span class="mention">@{html.escape(names(m.group(1) or m.group(2)))}</span>',
        text,
    )
    text = re.sub(r"<#(\w+)>", lambda m: f'<span class="mention">#{m.group(1).lower()}</span>', text)
    text = re.sub(r"`([^`\n]+)`", r"<code>\1</code>", text)
    text = re.sub(r"(?<![\w*])\*([^*\n]+)\*(?![\w*])", r"<b>\1</b>", text)
    return re.sub(r":([a-z_]+):", lambda m: EMOJI.get(m.group(1), m.group(0)), text)


def cell_html(cell: dict[str, Any], names: Callable[[str], str]) -> str:
    if cell["type"] == "raw_text":
        return cell["text"]
    out = []
    for section in cell["elements"]:
        for e in section["elements"]:
            if e["type"] == "user":
                out.append(f'<span class="mention">@{html.escape(names(e["user_id"]))}</span>')
            else:
                t = html.escape(e["text"], quote=False)
                style = e.get("style") or {}
                t = f"<code>{t}</code>" if style.get("code") else t
                out.append(f"<b>{t}</b>" if style.get("bold") else t)
    return "".join(out)


def blocks_html(blocks: list[dict[str, Any]], names: Callable[[str], str]) -> str:
    out = []
    for b in blocks:
        kind = b["type"]
        if kind == "header":
            out.append(f"<h1>{mrkdwn(b['text']['text'], names)}</h1>")
        elif kind == "section" and "fields" in b:
            fields = "".join(f"<div>{mrkdwn(f['text'], names)}</div>" for f in b["fields"])
            out.append(f'<div class="fields">{fields}</div>')
        elif kind == "section":
            out.append(f'<div class="section">{mrkdwn(b["text"]["text"], names)}</div>')
        elif kind == "context":
            out.append(
                f'<div class="context">{" ".join(mrkdwn(e["text"], names) for e in b["elements"])}</div>'
            )
        elif kind == "divider":
            out.append("<hr>")
        elif kind == "actions":
            buttons = "".join(
                f'<span class="btn {e.get("style", "")}">{mrkdwn(e["text"]["text"], names)}</span>'
                for e in b["elements"]
            )
            out.append(f'<div class="actions">{buttons}</div>')
        elif kind == "table":
            align = [s.get("align", "left") for s in b.get("column_settings") or []]
            align += ["left"] * max(0, max((len(r) for r in b["rows"]), default=0) - len(align))
            rows = "".join(
                "<tr>"
                + "".join(
                    f'<td style="text-align:{align[i]}">{cell_html(c, names)}</td>' for i, c in enumerate(row)
                )
                + "</tr>"
                for row in b["rows"]
            )
            out.append(f"<table>{rows}</table>")
        elif kind == "image":
            out.append(f'<img class="chart" src="{b["image_url"]}">')
    return "\n".join(out)


def message_html(blocks: list[dict[str, Any]], names: Callable[[str], str], *, when: str = "10:42") -> str:
    return (
        '<div class="msg"><div class="avatar">tb</div><div style="flex:1">'
        f'<span class="who">tunebot</span> <span class="app">APP</span><span class="when">{when}</span>'
        f"{blocks_html(blocks, names)}</div></div>"
    )


def page(body: str, title: str) -> str:
    return (
        f'<html><head><meta charset="utf-8"><style>{CSS}</style></head><body><div class="bar">{title}</div>'
        f'<div class="pane">{body}</div></body></html>'
    )


def screenshot(html_path: Path, png: Path, *, height: int) -> Path:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        raise SystemExit("no chromium: apt-get install chromium")
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={png}",
            f"--window-size=930,{height}",
            html_path.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return png
