#!/usr/bin/python3
"""make_image_vectors.py — writes tests/images/: small sample images (PNG, JPEG, WebP in every mode the
reader handles, plus broken ones) and vectors.safetensors, the values Pillow gives for them: decoding
(Image.open(f).convert("RGB") and .convert("L")), resizing (Image.resize(size, LANCZOS), which Pillow runs
as NEAREST for palette and bilevel images and in premultiplied alpha for LA/RGBA), the FLUX.2 reference
preprocessing (area rule, floor, center crop, [-1, 1]) and the inpainting init image + mask preparation
(Lanczos stretch, mask to L, binarize, bilinear to the packed latent grid as torch's interpolate computes
it, written out here with numpy).

Run with Debian's python3-pil and python3-numpy (apt-get install python3-pil python3-numpy):
    /usr/bin/python3 tools/make_image_vectors.py
The outputs are committed; the tests read them and never need Python.
"""
import io
import json
import math
import os
import struct
import zlib

import numpy as np
import PIL
from PIL import Image

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "images")
RNG = np.random.default_rng(1234)
tensors = {}


def put(name, arr):
    tensors[name] = np.ascontiguousarray(arr)


def save_safetensors(path, ts):
    header, blobs, off = {}, [], 0
    dt = {np.dtype("uint8"): "U8", np.dtype("float32"): "F32", np.dtype("int32"): "I32"}
    for k in sorted(ts):
        a = ts[k]
        b = a.tobytes()
        header[k] = {"dtype": dt[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"generator": "tools/make_image_vectors.py", "pillow": PIL.__version__}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def raw_png(path, w, h, bitdepth, ctype, rows, extra=b"", interlace=False):
    """A PNG written by hand (for what Pillow cannot write: 2-bit gray, Adam7, 16-bit, absurd sizes)."""
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", w, h, bitdepth, ctype, 0, 0, 1 if interlace else 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + extra +
                chunk(b"IDAT", zlib.compress(b"".join(b"\x00" + r for r in rows))) + chunk(b"IEND", b""))


def smooth(w, h, c):
    """A smooth pattern with some noise (JPEG and WebP keep it recognisable)."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    planes = [128 + 100 * np.sin(x / (5 + 3 * k) + y / (7 + 2 * k) + k) for k in range(c)]
    a = np.stack(planes, -1) + RNG.normal(0, 12, (h, w, c))
    return np.clip(a, 0, 255).astype(np.uint8)


def decode_vectors(name, path):
    im = Image.open(path)
    put("rgb." + name, np.array(im.convert("RGB")))
    put("l." + name, np.array(im.convert("L")))
    return im


def main():
    os.makedirs(OUT, exist_ok=True)
    p = lambda n: os.path.join(OUT, n)
    W, H = 37, 23

    # ---------------- PNG in every 8-bit mode ----------------
    rgb = smooth(W, H, 3)
    Image.fromarray(rgb, "RGB").save(p("rgb.png"))
    rgba = smooth(W, H, 4)
    rgba[..., 3] = RNG.integers(0, 256, (H, W))
    rgba[0, :, 3] = 0          # fully transparent pixels keep their colour in the file
    rgba[1, :, 3] = 255
    Image.fromarray(rgba, "RGBA").save(p("rgba.png"))
    gray = smooth(W, H, 1)[..., 0]
    Image.fromarray(gray, "L").save(p("gray.png"))
    la = np.stack([gray, RNG.integers(0, 256, (H, W)).astype(np.uint8)], -1)
    la[0, :, 1] = 0
    Image.fromarray(la, "LA").save(p("graya.png"))
    pal_img = Image.fromarray(rgb, "RGB").quantize(colors=200)
    pal_img.save(p("palette.png"), transparency=bytes([255, 0, 128] + [200] * 10))
    pal16 = Image.fromarray(rgb, "RGB").quantize(colors=16)
    pal16.save(p("palette4.png"), bits=4)
    Image.fromarray(gray, "L").convert("1").save(p("gray1.png"))
    Image.fromarray(gray, "L").save(p("gray_trns.png"), transparency=int(gray[3, 3]))
    Image.fromarray(rgb, "RGB").save(p("rgb_trns.png"), transparency=tuple(int(v) for v in rgb[2, 2]))
    # 2-bit gray and an Adam7-interlaced RGB image, written by hand
    g2 = RNG.integers(0, 4, (H, W))
    rows = []
    for y in range(H):
        bits = "".join(format(int(v), "02b") for v in g2[y]) + "0" * ((-2 * W) % 8)
        rows.append(bytes(int(bits[i:i + 8], 2) for i in range(0, len(bits), 8)))
    raw_png(p("gray2.png"), W, H, 2, 0, rows)
    passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
    data = b""
    for x0, y0, dx, dy in passes:
        sub = rgb[y0::dy, x0::dx]
        if sub.shape[0] and sub.shape[1]:
            data += b"".join(b"\x00" + sub[y].tobytes() for y in range(sub.shape[0]))
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    with open(p("interlaced.png"), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 1)) +
                chunk(b"IDAT", zlib.compress(data)) + chunk(b"IEND", b""))

    # ---------------- JPEG ----------------
    Image.fromarray(rgb, "RGB").save(p("rgb420.jpg"), quality=90)
    Image.fromarray(rgb, "RGB").save(p("rgb444.jpg"), quality=95, subsampling=0)
    Image.fromarray(rgb, "RGB").save(p("progressive.jpg"), quality=85, progressive=True)
    Image.fromarray(gray, "L").save(p("gray.jpg"), quality=90)

    # ---------------- WebP ----------------
    Image.fromarray(rgb, "RGB").save(p("lossy.webp"), quality=80)
    Image.fromarray(rgba, "RGBA").save(p("lossless_rgba.webp"), lossless=True, exact=True)
    Image.fromarray(rgba, "RGBA").save(p("lossy_alpha.webp"), quality=80)

    good = ["rgb.png", "rgba.png", "gray.png", "graya.png", "palette.png", "palette4.png", "gray1.png",
            "gray_trns.png", "rgb_trns.png", "gray2.png", "interlaced.png", "rgb420.jpg", "rgb444.jpg",
            "progressive.jpg", "gray.jpg", "lossy.webp", "lossless_rgba.webp", "lossy_alpha.webp"]
    modes = {}
    for f in good:
        im = decode_vectors(f, p(f))
        modes[f] = im.mode

    # ---------------- images that must be refused ----------------
    raw_png(p("bad_rgb16.png"), 2, 2, 16, 2, [struct.pack(">6H", *range(6))] * 2)
    raw_png(p("bad_gray16.png"), 2, 2, 16, 0, [struct.pack(">2H", 1000, 65535)] * 2)
    Image.fromarray(smooth(16, 16, 4), "CMYK").save(p("bad_cmyk.jpg"), quality=90)
    for f in ["rgb.png", "rgb420.jpg", "lossy.webp", "progressive.jpg"]:
        b = open(p(f), "rb").read()
        ext = f.rsplit(".", 1)[1]
        open(p("bad_truncated_" + f.replace(".", "_") + "." + ext), "wb").write(b[: len(b) * 6 // 10])
    open(p("bad_not_image.png"), "wb").write(b"this is not an image\n")
    open(p("bad_empty.png"), "wb").write(b"")
    # absurd sizes in otherwise valid headers (decompression bombs): refused before any allocation
    raw_png(p("bad_huge.png"), 100000, 100000, 8, 2, [b"\x00" * 30])
    b = bytearray(open(p("rgb420.jpg"), "rb").read())
    i = b.index(b"\xff\xc0")
    b[i + 5:i + 9] = struct.pack(">HH", 60000, 60000)
    open(p("bad_huge.jpg"), "wb").write(bytes(b))
    b = bytearray(open(p("lossless_rgba.webp"), "rb").read())
    i = b.index(b"VP8L") + 8
    bits = struct.unpack("<I", bytes(b[i + 1:i + 5]))[0]
    bits = (bits & ~((1 << 28) - 1)) | 16383 | (16383 << 14)
    b[i + 1:i + 5] = struct.pack("<I", bits)
    open(p("bad_huge.webp"), "wb").write(bytes(b))
    frames = [Image.fromarray(smooth(16, 16, 3), "RGB") for _ in range(2)]
    frames[0].save(p("bad_animated.webp"), save_all=True, append_images=frames[1:], duration=100)

    # ---------------- resizing as Pillow does it ----------------
    cases = [("rgb.png", 17, 11), ("rgb.png", 50, 40), ("rgb.png", 37, 11), ("rgb.png", 20, 23),
             ("rgb.png", 5, 3), ("rgba.png", 17, 11), ("rgba.png", 50, 40), ("graya.png", 17, 11),
             ("gray.png", 17, 11), ("palette.png", 17, 11), ("palette.png", 50, 40), ("gray1.png", 17, 11),
             ("rgb420.jpg", 29, 31)]
    for f, w, h in cases:
        im = Image.open(p(f))
        r = im.resize((w, h), Image.LANCZOS)
        put("resize.%s.%dx%d" % (f, w, h), np.array(r.convert("RGB")))
        put("resize_l.%s.%dx%d" % (f, w, h), np.array(r.convert("L")))

    # ---------------- the reference rule: sizes ----------------
    def ref_sizes(w, h, multiple):
        if w * h > 1024 * 1024:
            scale = math.sqrt(1024 * 1024 / (w * h))
            w, h = int(w * scale), int(h * scale)
        return w, h, (w // multiple) * multiple, (h // multiple) * multiple
    sizes = [(1024, 1024), (1025, 1024), (1024, 1025), (4096, 4096), (3000, 2000), (1920, 1080), (1080, 1920),
             (8000, 1000), (2897, 362), (1023, 1025), (100, 77), (64, 72), (4000, 3000), (1500, 1500),
             (2048, 1536), (5000, 700), (1537, 683), (12345, 6789)]
    rows = []
    for w, h in sizes:
        for m in (16, 8):
            rows.append([w, h, m] + list(ref_sizes(w, h, m)))
    put("ref_sizes", np.array(rows, np.int32))

    # ---------------- the reference rule: a large image, resized to 1024² area then cropped ----------------
    BW, BH = 1100, 1000
    y, x = np.mgrid[0:BH, 0:BW].astype(np.int64)
    big = np.stack([(x * 3 + y * 5) % 256, (x * y // 7) % 256, ((x ^ y) * 11) % 256], -1).astype(np.uint8)
    # (the C test builds the same pixels from the same formula)
    im = Image.fromarray(big, "RGB")
    rw, rh, fw, fh = ref_sizes(BW, BH, 16)
    r = im.resize((rw, rh), Image.LANCZOS)
    left, top = (rw - fw) // 2, (rh - fh) // 2
    c = np.array(r.crop((left, top, left + fw, top + fh)).convert("RGB"))
    flat = c.reshape(-1)
    idx = np.arange(0, flat.size, 97, dtype=np.int64)
    put("big.size", np.array([BW, BH, rw, rh, fw, fh], np.int32))
    put("big.sample_step", np.array([97], np.int32))
    put("big.sample", flat[idx])

    # ---------------- the reference rule on the editing fixtures (multiple 8: the tiny VAE) ----------------
    fx = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "edit")
    for f in ["ref0.png", "ref1.png"]:
        im = Image.open(os.path.join(fx, f))
        w, h, fw, fh = ref_sizes(im.size[0], im.size[1], 8)
        left, top = (w - fw) // 2, (h - fh) // 2
        put("ref." + f, np.array(im.crop((left, top, left + fw, top + fh)).convert("RGB")))   # [h, w, 3] u8
    u = np.arange(256, dtype=np.uint8)[None, :]
    # the image processor's [-1, 1] values: pil_to_numpy (float32 / 255) then normalize (2x - 1), per u8 value
    put("normalize_table", (2.0 * (u.astype(np.float32) / 255.0) - 1.0).astype(np.float32)[0])

    # ---------------- inpainting: init image + mask ----------------
    def bilinear_down(m, th, tw):
        """torch.nn.functional.interpolate(mode="bilinear", align_corners=False) on [H, W], float32."""
        H_, W_ = m.shape
        out = np.zeros((th, tw), np.float32)
        sh, sw = np.float32(H_ / th), np.float32(W_ / tw)
        def src(i, s, n):
            v = np.float32(s * np.float32(i + 0.5) - np.float32(0.5))
            v = max(v, np.float32(0))
            i0 = int(v)
            i1 = i0 + (1 if i0 < n - 1 else 0)
            l1 = np.float32(v - np.float32(i0))
            return i0, i1, np.float32(1) - l1, l1
        for i in range(th):
            y0, y1, a0, a1 = src(i, sh, H_)
            for j in range(tw):
                x0, x1, b0, b1 = src(j, sw, W_)
                out[i, j] = a0 * (b0 * m[y0, x0] + b1 * m[y0, x1]) + a1 * (b0 * m[y1, x0] + b1 * m[y1, x1])
        return out

    def inpaint_case(tag, init, mask, multiple):
        rw, rh = init.size
        if rw * rh > 1024 * 1024:
            s = math.sqrt(1024 * 1024 / (rh * rw))
            init = init.resize((int(rw * s), int(rh * s)), Image.LANCZOS)
            rw, rh = init.size
        w, h = (rw // multiple) * multiple, (rh // multiple) * multiple
        im = init.resize((w, h), Image.LANCZOS).convert("RGB")
        put("inpaint.%s.init" % tag, np.array(im))      # [h, w, 3] u8 (normalized through the table)
        m = mask.resize((w, h), Image.LANCZOS).convert("L")
        mf = np.array(m).astype(np.float32) / 255.0
        mf[mf < 0.5] = 0
        mf[mf >= 0.5] = 1
        put("inpaint.%s.mask" % tag, mf)
        put("inpaint.%s.mask_latent" % tag, bilinear_down(mf, h // multiple, w // multiple))
        put("inpaint.%s.size" % tag, np.array([w, h], np.int32))

    inpaint_case("fixture", Image.open(os.path.join(fx, "ref9.png")), Image.open(os.path.join(fx, "mask.png")), 8)
    ref0 = Image.open(os.path.join(fx, "ref0.png"))
    yy, xx = np.mgrid[0:77, 0:100]
    mrgb = np.stack([(xx * 4) % 256, (yy * 3) % 256, ((xx + yy) * 2) % 256], -1).astype(np.uint8)
    Image.fromarray(mrgb, "RGB").save(p("mask_rgb.png"))
    inpaint_case("stretch", ref0, Image.open(p("mask_rgb.png")), 8)
    inpaint_case("stretch16", ref0, Image.open(p("mask_rgb.png")), 16)

    save_safetensors(p("vectors.safetensors"), tensors)
    with open(p("modes.json"), "w") as f:
        json.dump(modes, f, indent=1, sort_keys=True)
    print("wrote %d tensors, Pillow %s" % (len(tensors), PIL.__version__))


if __name__ == "__main__":
    main()
