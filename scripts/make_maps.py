"""Draw the book's "you are here" maps: one small SVG per numbered chapter, nbs/figures/map-NN.svg,
and the closing page's map with every piece built, nbs/figures/map-all.svg.

The map shows the whole model as a reader meets it — text in, the pieces of a block, the stack,
the model, and what is done with it — and highlights the pieces the chapter builds.
Usage: python scripts/make_maps.py   (rewrites the SVGs; they are committed)
"""
from html import escape
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "nbs" / "figures"

# (chapter, label, x, y, width): boxes of the map, in reading order. The map is drawn at about the
# width it is shown at in the book's column (a 1280-px window), so its 13-px labels stay legible.
BOXES = [
    (2, "tokens → vectors", 4, 52, 140),
    (7, "+ positions", 4, 88, 140),
    (3, "Q, K, V", 162, 16, 96),
    (4, "scaled dot-product", 266, 16, 206),
    (1, "weighted mix", 162, 52, 151),
    (8, "masks", 321, 52, 151),
    (5, "heads: split · attend · merge", 162, 88, 234),
    (7, "RoPE", 404, 88, 68),
    (6, "feed-forward", 162, 124, 118),
    (9, "add & norm", 288, 124, 184),
    (9, "N× stack of blocks", 154, 196, 326),
    (11, "the full models", 490, 16, 220),
    (12, "generate", 490, 52, 108),
    (13, "train", 602, 52, 108),
    (10, "KV cache", 490, 88, 108),
    (14, "processes", 602, 88, 108),
    (15, "real weights", 490, 124, 108),
    (16, "GGUF file", 602, 124, 108),
    (17, "LoRA", 490, 160, 108),
    (18, "4-bit blocks", 602, 160, 108),
    (19, "instruction tuning", 490, 196, 220),
]
ARROWS = [((74, 80), (74, 88)), ((144, 102), (154, 102)), ((480, 30), (490, 30)),
          ((317, 186), (317, 196))]
WIDTH, HEIGHT = 714, 232


def svg(chapter: int | None) -> str:
    "The map with `chapter`'s pieces highlighted (None: all of them)."
    what = f"chapter {chapter} highlighted" if chapter else "every chapter's piece built"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
        f'height="{HEIGHT}" role="img" aria-label="Map of the book: {what}">',
        '<rect x="154" y="8" width="326" height="178" rx="10" fill="#f4f6fb" stroke="#b8c2d8"/>',
        '<text x="472" y="176" text-anchor="end" font-family="sans-serif" font-size="13" '
        'fill="#5a6478">one Transformer block</text>',
    ]
    for n, label, x, y, w in BOXES:
        here = chapter is None or n == chapter
        fill, stroke, color = ("#2f6fdb", "#1d4fa8", "#ffffff") if here else ("#ffffff", "#8a94a8", "#2b3445")
        weight = "bold" if here else "normal"
        parts.append(f'<rect x="{x}" y="{y}" width="{w}" height="28" rx="6" fill="{fill}" '
                     f'stroke="{stroke}" stroke-width="{2 if here else 1}"/>')
        parts.append(f'<text x="{x + w / 2}" y="{y + 18.5}" text-anchor="middle" font-family="sans-serif" '
                     f'font-size="13" font-weight="{weight}" fill="{color}">{n}. {escape(label)}</text>')
    for (x0, y0), (x1, y1) in ARROWS:
        parts.append(f'<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y1}" stroke="#5a6478" stroke-width="1.5"/>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for chapter in range(1, 20):
        (OUT / f"map-{chapter:02d}.svg").write_text(svg(chapter), encoding="utf-8")
    (OUT / "map-all.svg").write_text(svg(None), encoding="utf-8")
    print(f"wrote 20 maps to {OUT}")


if __name__ == "__main__":
    main()
