#!/usr/bin/env python3
"""make_api_edit_seeds.py — seeds for fuzz_api_edit (fuzz/corpus/api_edit): edit-request forms in the drive's
format (fuzz_api_edit_drive.h: byte 0 = piece size, parts separated by "\\n--\\n", first line "name[;filename]"),
with the editing fixtures' real images. Standard library only. Run from the repository root."""
import os

FX = "tests/fixtures/edit"
IM = "tests/images"
OUT = "fuzz/corpus/api_edit"


def read(path):
    with open(path, "rb") as f:
        return f.read()


def form(piece, parts):
    out = bytes([piece])
    for i, (head, data) in enumerate(parts):
        if i:
            out += b"\n--\n"
        out += head.encode() + b"\n" + data
    return out


ref0, ref1, ref9, mask = (read(f"{FX}/{n}") for n in ("ref0.png", "ref1.png", "ref9.png", "mask.png"))
P = ("prompt", b"a snow leopard")
seeds = {
    "one_ref": form(0, [("image[];ref0.png", ref0), P, ("seed", b"5"), ("steps", b"2")]),
    "one_ref_pieces": form(17, [("image[];ref0.png", ref0), P, ("n", b"2"), ("size", b"64x48")]),
    "two_refs": form(0, [("image;ref0.png", ref0), ("image;ref1.png", ref1), P, ("guidance", b"3.5"), ("size", b"auto")]),
    "inpaint": form(5, [("image[];ref9.png", ref9), ("mask;mask.png", mask), P, ("strength", b"0.6")]),
    "inpaint_ref": form(0, [("image[]", ref9), ("image[]", ref0), ("mask", mask), P, ("stream", b"true")]),
    "alpha_mask": form(0, [("image[]", read(f"{IM}/rgba.png")), ("mask", read(f"{IM}/rgba.png")), P]),
    "jpeg_webp": form(0, [("image[]", read(f"{IM}/rgb420.jpg")), ("image[]", read(f"{IM}/lossy.webp")), P]),
    "no_image": form(0, [P]),
    "no_prompt": form(0, [("image[]", ref0)]),
    "truncated": form(0, [("image[]", read(f"{IM}/bad_truncated_rgb_png.png")), P]),
    "cmyk": form(0, [("image[]", read(f"{IM}/bad_cmyk.jpg")), P]),
    "huge": form(0, [("image[]", read(f"{IM}/bad_huge.png")), P]),
    "mask_size": form(0, [("image[]", ref9), ("mask", ref0), P]),
    "strength_no_mask": form(0, [("image[]", ref0), P, ("strength", b"0.5")]),
    "strength_text": form(0, [("image[]", ref9), ("mask", mask), P, ("strength", b"most")]),
    "two_masks": form(0, [("image[]", ref9), ("mask", mask), ("mask", mask), P]),
    "twice": form(0, [("image[]", ref0), P, P]),
    "unknown": form(0, [("image[]", ref0), P, ("noise_file", b"/etc/passwd")]),
    "types": form(0, [("image[]", ref0), P, ("n", b"1.5"), ("seed", b"-3"), ("steps", b"9999999999999999999")]),
    "nul": form(0, [("image[]", ref0), ("prompt", b"a\x00b")]),
    "many": form(0, [("image[]", ref0)] * 17 + [P]),
    "empty_image": form(0, [("image[];empty.png", b""), P]),
    "long_field": form(0, [("image[]", ref0), ("prompt", b"x" * 70000)]),
}
os.makedirs(OUT, exist_ok=True)
for name, data in seeds.items():
    with open(f"{OUT}/{name}", "wb") as f:
        f.write(data)
print(f"{len(seeds)} seeds in {OUT}")
