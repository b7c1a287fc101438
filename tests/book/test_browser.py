"""The built book in a real browser: headless Chromium (Debian's package, never a downloaded one) opens every
page from a local server with no network, and checks what a reader would see. Screenshots of every page go to
_build/screenshots/ for a human to look at. Skipped unless MT_BROWSER_TESTS=1 (make test sets it)."""

import functools
import http.server
import json
import os
import shutil
import threading
from urllib.parse import urljoin, urlparse

import pytest

from helpers import ROOT, chapter_notebooks

HTML = ROOT / "_build" / "html"

SHOTS = ROOT / "_build" / "screenshots"

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.browser

if os.environ.get("MT_BROWSER_TESTS") != "1":
    pytest.skip("browser checks run under `make test` (MT_BROWSER_TESTS=1)", allow_module_level=True)

PAGES = [p.stem for p in chapter_notebooks()] + ["intro", "api", "further_reading"]


@pytest.fixture(scope="module")
def server():
    if not (HTML / "index.html").exists():
        pytest.fail("build the book first: make book")
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # no request log in the test output
            pass

    handler = functools.partial(Quiet, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.fail("Chromium is not installed: apt-get install -y chromium (make test does it)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
            "--disable-component-update", "--disable-sync", "--disable-quic"])
        yield b
        b.close()


def _visit(browser, server, name):
    "Open one page with every request outside 127.0.0.1 blocked; return what the page showed and logged."
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors, offsite = [], []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))

    def route(r):
        if urlparse(r.request.url).hostname in ("127.0.0.1", None):
            return r.continue_()
        offsite.append(r.request.url)
        return r.abort()

    page.route("**/*", route)
    page.goto(urljoin(server, f"nbs/{name}.html"), wait_until="load")
    page.wait_for_function("() => !window.MathJax || !MathJax.startup || MathJax.startup.promise", timeout=20000)
    page.evaluate("() => window.MathJax && MathJax.startup ? MathJax.startup.promise : null")
    page.wait_for_timeout(300)  # widget manager renders after load
    info = page.evaluate("""() => ({
        text: document.body.innerText,
        math: document.querySelectorAll('mjx-container').length,
        images: Array.from(document.images).map(i => ({src: i.src, w: i.naturalWidth})),
        widgets: document.querySelectorAll('.jupyter-widgets, .widget-interact, .widget-slider').length,
        scrolling: Array.from(document.querySelectorAll('.cell_input pre'))
            .filter(e => e.scrollWidth > e.clientWidth + 1)
            .map(e => e.innerText.split('\\n').reduce((a, b) => a.length >= b.length ? a : b)),
        outputs_scrolling: Array.from(document.querySelectorAll('.cell_output pre'))
            .filter(e => e.scrollWidth > e.clientWidth + 1)
            .map(e => e.innerText.split('\\n').reduce((a, b) => a.length >= b.length ? a : b)),
        // display math wider than the text column: cut off, or scrolled inside its box
        math_wide: (() => {
            const column = document.querySelector('main article, main') || document.body;
            const right = column.getBoundingClientRect().right;
            return Array.from(document.querySelectorAll('mjx-container[display="true"]'))
                .filter(e => {
                    const m = e.querySelector('mjx-math') || e;
                    const box = m.getBoundingClientRect();
                    return box.right > right + 1 || e.scrollWidth > e.clientWidth + 1
                        || box.width > e.getBoundingClientRect().width + 1;
                })
                .map(e => (e.textContent || '').slice(0, 60));
        })(),
        no_alt: Array.from(document.querySelectorAll('main img'))  // a live widget's saved output excepted
            .filter(i => !i.closest('.jupyter-widgets, .widget-output'))
            .filter(i => !(i.getAttribute('alt') || '').trim()).map(i => i.src.slice(0, 80)),
        links: Array.from(document.querySelectorAll('a[href]')).map(a => a.getAttribute('href')),
        ids: Array.from(document.querySelectorAll('[id]')).map(e => e.id),
    })""")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
    context.close()
    info["errors"], info["offsite"] = errors, offsite
    return info


@pytest.fixture(scope="module")
def visits(browser, server):
    return {name: _visit(browser, server, name) for name in PAGES}


def _markdown_source(name):
    path = ROOT / "nbs" / f"{name}.ipynb"
    if not path.exists():
        return (ROOT / "nbs" / f"{name}.md").read_text()
    return "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "markdown")


@pytest.mark.parametrize("name", PAGES)
def test_math_is_typeset(visits, name):
    v = visits[name]
    for raw in ("$$", "\\frac", "\\sqrt", "\\begin{", "\\("):
        assert raw not in v["text"], f"raw {raw!r} visible on {name}.html: MathJax did not typeset it"
    if "$" in _markdown_source(name):
        assert v["math"] > 0, f"{name}.html has math but MathJax rendered none"


@pytest.mark.parametrize("name", PAGES)
def test_figures_load(visits, name):
    broken = [i["src"] for i in visits[name]["images"] if i["w"] == 0]
    assert not broken, f"images that did not load on {name}.html: {broken}"


WITH_WIDGETS = [p.stem for p in chapter_notebooks()
                if json.loads(p.read_text())["metadata"].get("widgets")]


def test_some_pages_have_widgets():
    assert WITH_WIDGETS, "no chapter saved widget state: test_widgets_render would check nothing"


@pytest.mark.parametrize("name", WITH_WIDGETS)
def test_widgets_render(visits, name):
    assert visits[name]["widgets"] > 0, f"{name}.html saved widget state but no widget was drawn"


@pytest.mark.parametrize("name", [p.stem for p in chapter_notebooks()])
def test_colab_button(visits, name, settings):
    repo = settings["git_url"].removeprefix("https://github.com/")
    want = f"https://colab.research.google.com/github/{repo}/blob/{settings['branch']}/nbs/{name}.ipynb"
    assert want in visits[name]["links"], f"no Open-in-Colab link to {want} on {name}.html"


@pytest.mark.parametrize("name", PAGES)
def test_no_console_errors_or_network(visits, name):
    v = visits[name]
    assert not v["errors"], f"console errors on {name}.html: {v['errors']}"
    assert not v["offsite"], f"{name}.html tried to load from the network: {v['offsite'][:5]}"


@pytest.mark.parametrize("name", PAGES)
def test_internal_links_resolve(visits, name):
    page = HTML / "nbs" / f"{name}.html"
    broken = []
    for href in visits[name]["links"]:
        u = urlparse(href)
        if u.scheme or href.startswith("mailto:"):
            continue
        target = page if not u.path else (page.parent / u.path).resolve()
        if target.is_dir():
            target = target / "index.html"
        if not target.exists():
            broken.append(href)
        elif u.fragment and target == page and u.fragment not in visits[name]["ids"]:
            broken.append(href)
    assert not broken, f"broken links on {name}.html: {broken}"


@pytest.mark.parametrize("name", PAGES)
def test_no_code_scrolls_sideways(visits, name):
    "At a 1280-px window every code input fits its column (no horizontal scroll bar)."
    wide = visits[name]["scrolling"]
    assert not wide, f"{name}.html: {len(wide)} code cells scroll sideways, e.g. {wide[0][:100]!r}"


@pytest.mark.parametrize("name", PAGES)
def test_no_output_scrolls_sideways(visits, name):
    "At a 1280-px window every printed output fits its column."
    wide = visits[name]["outputs_scrolling"]
    assert not wide, f"{name}.html: {len(wide)} outputs scroll sideways, e.g. {wide[0][:100]!r}"


@pytest.mark.parametrize("name", PAGES)
def test_display_math_fits_the_column(visits, name):
    "At a 1280-px window no display equation is cut off or scrolls: long ones are split over lines."
    wide = visits[name]["math_wide"]
    assert not wide, f"{name}.html: {len(wide)} display equations wider than the column, e.g. {wide[0]!r}"


@pytest.mark.parametrize("name", PAGES)
def test_images_have_alt_text(visits, name):
    assert not visits[name]["no_alt"], f"{name}.html: images without alt text: {visits[name]['no_alt']}"


ANIMATED = [p.stem for p in chapter_notebooks() if "anim-slider" in p.read_text(encoding="utf-8")]


def test_some_pages_have_interactive_figures():
    assert ANIMATED, "no chapter has a static-book interactive figure (a to_jshtml animation)"


@pytest.mark.parametrize("name", ANIMATED)
def test_interactive_figures_respond(browser, server, name):
    "Moving an animation's slider in the static book (no kernel) changes the picture."
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.route("**/*", lambda r: r.continue_() if urlparse(r.request.url).hostname in ("127.0.0.1", None)
               else r.abort())
    page.goto(urljoin(server, f"nbs/{name}.html"), wait_until="load")
    changed = page.evaluate("""async () => {
        const out = [];
        for (const slider of document.querySelectorAll('input.anim-slider')) {
            const img = slider.closest('.animation').querySelector('img');
            const before = img.src;
            slider.value = slider.max;
            slider.dispatchEvent(new Event('input', {bubbles: true}));
            await new Promise(r => setTimeout(r, 100));
            out.push(img.src !== before);
        }
        return out;
    }""")
    context.close()
    assert changed, f"{name}.html: no animation slider found in the page"
    assert all(changed), f"{name}.html: moving the slider did not change the picture: {changed}"
