"""Render nbdev notebooks as book pages without nbdev's noise.

On Sphinx's `source-read` event each notebook's JSON is rewritten before myst-nb parses it:
- `#|` directive lines are removed from every code cell;
- `#| hide`, `#| default_exp` and `#| include: false` cells are removed from the page,
  `#| echo: false` hides the input and `#| output: false` the output (as myst-nb cell tags);
- `show_doc(...)` cells keep only their rendered output, without the `---` rule that nbdev puts
  first (a transition inside an output breaks docutils);
- `#| alt: TEXT` becomes the alt text of the images the cell outputs (myst-nb's `mystnb.image.alt`);
- the chapter's Colab install cell (it runs only in Colab) is removed from the page;
- a matplotlib `to_jshtml` animation gets the cell's alt text on its frame image, and loses its link
  to Font Awesome on a CDN (the theme serves Font Awesome itself).
Cell tags such as `nbval-ignore-output` are metadata: myst-nb does not print them.

It also mends two things the browser check caught in the themes' output: a script that sphinx-thebe adds twice
(a "THEBE_JS_URL has already been declared" error on every page) is included once, and static/widgets-offline.js
points RequireJS at the vendored widget manager and lets it, written for MathJax 2, typeset through MathJax 3.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

DIRECTIVE = re.compile(r"^\s*#\|\s*(.*?)\s*$")
REMOVE_CELL = {"hide", "default_exp", "include: false"}
ALT = re.compile(r"^alt:\s*(.+)$")
FONT_AWESOME_LINK = re.compile(r"<link[^>]*font-awesome[^>]*>")
COLAB_INSTALL = '"google.colab" in sys.modules'
SHOW_DOC = re.compile(r"^\s*show_doc\(.*\)\s*;?\s*$")


def _directives(lines: list[str]) -> tuple[list[str], list[str]]:
    "Split a cell's lines into its nbdev directives and the remaining code."
    found, code = [], []
    for line in lines:
        m = DIRECTIVE.match(line)
        (found if m else code).append(m.group(1) if m else line)
    return found, code


def _add_tag(cell: dict, tag: str) -> None:
    tags = cell.setdefault("metadata", {}).setdefault("tags", [])
    if tag not in tags:
        tags.append(tag)


def _strip_rule(text: str) -> str:
    "Drop the horizontal rule nbdev's show_doc puts before each entry."
    return re.sub(r"\A\s*---\s*\n", "", text)


def clean_cell(cell: dict) -> None:
    if cell.get("cell_type") != "code":
        return
    src = cell.get("source", "")
    lines = (src if isinstance(src, str) else "".join(src)).split("\n")
    found, code = _directives(lines)
    words = {d.split()[0] if d.split() else "" for d in found} | set(found)
    if words & REMOVE_CELL:
        _add_tag(cell, "remove-cell")
    if "echo: false" in found:
        _add_tag(cell, "remove-input")
    if "output: false" in found:
        _add_tag(cell, "remove-output")
    alts = [m.group(1) for m in map(ALT.match, found) if m]
    if alts:
        image = cell["metadata"].setdefault("mystnb", {}).setdefault("image", {})
        image["alt"] = alts[0]
        for out in cell.get("outputs", []):  # a to_jshtml animation draws its frames in an <img>
            html = out.get("data", {}).get("text/html")
            if html is not None:
                html = html if isinstance(html, str) else "".join(html)
                alt = alts[0].replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")
                out["data"]["text/html"] = html.replace('<img id="_anim_img', f'<img alt="{alt}" id="_anim_img')
    for out in cell.get("outputs", []):  # to_jshtml links Font Awesome from a CDN; the theme has it
        html = out.get("data", {}).get("text/html")
        if html is not None:
            html = html if isinstance(html, str) else "".join(html)
            out["data"]["text/html"] = FONT_AWESOME_LINK.sub("", html)
    if COLAB_INSTALL in "\n".join(code) and "pip" in "\n".join(code):
        _add_tag(cell, "remove-cell")  # the Colab install cell: it does nothing outside Colab
    while code and not code[0].strip():
        code.pop(0)
    cell["source"] = "\n".join(code)
    body = [line for line in code if line.strip()]
    if body and all(SHOW_DOC.match(line) for line in body):
        _add_tag(cell, "remove-input")
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "text/markdown" in data:
                md = data["text/markdown"]
                data["text/markdown"] = _strip_rule(md if isinstance(md, str) else "".join(md))
    if not body and not cell.get("outputs"):
        _add_tag(cell, "remove-cell")


def clean_notebook(text: str) -> str:
    nb = json.loads(text)
    for cell in nb.get("cells", []):
        clean_cell(cell)
    return json.dumps(nb)


def _on_source_read(app, docname: str, source: list[str]) -> None:
    if str(app.env.doc2path(docname)).endswith(".ipynb"):
        source[0] = clean_notebook(source[0])


def _dedupe_scripts(app, pagename, templatename, context, doctree) -> None:
    "Drop repeated script tags (same file, same inline body) from a page."
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for js in scripts:
        key = (getattr(js, "filename", str(js)) or "", getattr(js, "attributes", {}).get("body"))  # None == ""
        if key not in seen:
            seen.add(key)
            unique.append(js)
    scripts[:] = unique


def _add_static(app) -> None:
    app.config.html_static_path.append(str(Path(__file__).parent / "static"))


def setup(app):
    app.connect("source-read", _on_source_read)
    app.connect("builder-inited", _add_static)
    app.connect("html-page-context", _dedupe_scripts)
    app.add_js_file("widgets-offline.js", priority=100)  # before RequireJS, MathJax and the widget manager
    app.add_css_file("book.css")  # code inputs fit the column (88 characters at 1280 px)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
