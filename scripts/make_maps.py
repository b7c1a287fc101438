"""Draw the book's "you are here" maps: one small SVG per numbered chapter, nbs/figures/map-NN.svg.

The map shows the whole model as a reader meets it — text in, the pieces of a block, the stack,
the model, and what is done with it — and highlights the pieces the chapter builds.
Usage: python scripts/make_maps.py   (rewrites the SVGs; they are committed)
"""
from html import escape
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "nbs" / "figures"

# (chapter, label, x, y, width): boxes of the map, in reading order
BOXES = [
    (2, "tokens → vectors", 6, 58, 126),
    (7, "+ positions", 140, 58, 96),
    (3, "Q, K, V", 256, 20, 76),
    (4, "scaled dot-product", 340, 20, 146),
    (1, "weighted mix", 494, 20, 154),
    (5, "heads: split · attend · merge", 256, 58, 392),
    (8, "masks", 256, 96, 76),
    (6, "feed-forward", 340, 96, 118),
    (9, "add & norm, N× stack", 466, 96, 182),
    (11, "model: embed → stack → head", 668, 20, 226),
    (12, "generate", 668, 58, 108),
    (13, "train", 784, 58, 110),
    (10, "KV cache", 668, 96, 108),
    (14, "processes", 784, 96, 110),
    (15, "real weights", 668, 134, 108),
    (16, "GGUF file", 784, 134, 110),
    (17, "LoRA", 668, 172, 108),
]
ARROWS = [((132, 72), (140, 72)), ((236, 72), (246, 72)), ((658, 72), (668, 72))]


def svg(chapter: int) -> str:
    parts = [
        '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 900 208" width="900" height="208" '
        f'role="img" aria-label="Map of the book: chapter {chapter} highlighted">',
        '<rect x="246" y="8" width="412" height="138" rx="10" fill="#f4f6fb" stroke="#b8c2d8"/>',
        '<text x="648" y="140" text-anchor="end" font-family="sans-serif" font-size="12" '
        'fill="#5a6478">one Transformer block</text>',
    ]
    for n, label, x, y, w in BOXES:
        here = n == chapter
        fill, stroke, color = ("#2f6fdb", "#1d4fa8", "#ffffff") if here else ("#ffffff", "#8a94a8", "#2b3445")
        weight = "bold" if here else "normal"
        parts.append(f'<rect x="{x}" y="{y}" width="{w}" height="28" rx="6" fill="{fill}" '
                     f'stroke="{stroke}" stroke-width="{2 if here else 1}"/>')
        parts.append(f'<text x="{x + w / 2}" y="{y + 18.5}" text-anchor="middle" font-family="sans-serif" '
                     f'font-size="13" font-weight="{weight}" fill="{color}">{n}. {escape(label)}</text>')
    for (x0, y0), (x1, y1) in ARROWS:
        parts.append(f'<line x1="{x0}" y1="{y0}" x2="{x1 - 1}" y2="{y1}" stroke="#5a6478" stroke-width="1.5"/>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for chapter in range(1, 18):
        (OUT / f"map-{chapter:02d}.svg").write_text(svg(chapter), encoding="utf-8")
    print(f"wrote 17 maps to {OUT}")


if __name__ == "__main__":
    main()
