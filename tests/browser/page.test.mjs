// page.test.mjs — the page of `ditrun serve` in a real browser: headless Chromium (Debian's /usr/bin/chromium,
// driven by puppeteer-core; no browser download) against a real server on an ephemeral port with the bundled tiny
// model (tiny sizes, few steps). Covers: the CPU default size from /health and the aspect presets; a generation
// (progress bar, size, gallery, download link, equal to the API's image), negative prompt and guidance; an edit with
// an uploaded reference image and an inpaint through a mask drawn on the canvas with the mouse (each equal to the
// API's image for the same form); the queue position of a waiting request and its cancel (taken out of the queue);
// cancelling a running job (the server goes idle, the next request is served at once); the history after a reload
// with "reuse settings" / "reuse seed", and its bound under the storage quota; the model label after an API key is
// entered; on a Z-Image server (tests/fixtures/zimage) the CFG normalization / truncation inputs, hidden for FLUX.2, are
// shown and sent. Prints PASS/FAIL lines (tests/test_browser.c runs it).
// usage: node page.test.mjs DITRUN MODEL CHROMIUM [SCREENSHOT.png]
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import puppeteer from "puppeteer-core";

const [ditrun, model, chromium, screenshot] = process.argv.slice(2);
const editDir = join(dirname(model), "edit");   // tests/fixtures/edit
let failed = 0;
const check = (name, ok, why) => {
  if (ok) console.log(`PASS ${name}`);
  else { console.log(`FAIL ${name}: ${why}`); failed++; }
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function startServer(extra = [], root = model) {
  const srv = spawn(ditrun, ["serve", "--model", root, "--port", "0", "--backend", "cpu", "--threads", "1",
                             "--max-sequence-length", "8", "-q", ...extra], { stdio: ["ignore", "pipe", "inherit"] });
  return new Promise((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => reject(new Error("no 'listening on' line in 30 s")), 30000);
    srv.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/127\.0\.0\.1:\d+)/);
      if (m) { clearTimeout(timer); resolve({ srv, url: m[1] }); }
    });
    srv.on("exit", (code) => reject(new Error(`the server exited with ${code}`)));
  });
}

async function stopServer(srv) {
  srv.kill("SIGTERM");
  return new Promise((r) => { if (srv.exitCode !== null) r(srv.exitCode); else srv.on("exit", (c) => r(c)); });
}

async function waitHealthy(url) {
  for (let i = 0; i < 300; i++) {
    try { if ((await fetch(url + "/health")).status === 200) return true; } catch (_) {}
    await sleep(100);
  }
  return false;
}

const health = async (url) => (await fetch(url + "/health")).json();
async function cancelledTotal(url) {
  const m = (await (await fetch(url + "/metrics")).text()).match(/^ditrun_jobs_cancelled_total (\d+)/m);
  return m ? Number(m[1]) : NaN;
}
// Poll /health until pred holds: the seconds it took, or -1 after limit_s.
async function until(url, pred, limitS) {
  const t0 = Date.now();
  while (Date.now() - t0 < limitS * 1000) {
    if (pred(await health(url))) return (Date.now() - t0) / 1000;
    await sleep(25);
  }
  return -1;
}

// An edit through the API with the same fields as the page's (files: [name, path or Buffer] in order).
async function apiEdit(url, fields, files) {
  const f = new FormData();
  for (const [k, v] of Object.entries(fields)) f.append(k, String(v));
  for (const [k, name, data] of files) f.append(k, new Blob([data], { type: "image/png" }), name);
  const r = await fetch(url + "/v1/images/edits", { method: "POST", body: f });
  return r.ok ? (await r.json()).data[0].b64_json : `HTTP ${r.status}: ${await r.text()}`;
}

const launchArgs = (profile) => ({
  executablePath: chromium,
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", `--user-data-dir=${profile}`],
});

const { srv, url } = await startServer();
const profile = mkdtempSync(join(tmpdir(), "ditrun-chromium-"));
let browser;
try {
  check("browser: server healthy", await waitHealthy(url), "/health never answered 200");
  browser = await puppeteer.launch(launchArgs(profile));
  const page = await browser.newPage();
  await page.setViewport({ width: 1200, height: 1000 });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(url + "/", { waitUntil: "load" });
  // the page asks /v1/models for the model's name and /health for the backend's default size
  await page.waitForFunction(() => document.getElementById("model").textContent.includes("model"), { timeout: 10000 });
  check("browser: the page shows the model", true, "");
  await page.waitForFunction(() => document.getElementById("width").value === "256", { timeout: 5000 }).catch(() => {});
  const dflt = await page.evaluate(() => [document.getElementById("width").value, document.getElementById("height").value,
                                          document.getElementById("note").textContent]);
  check("browser: on the CPU backend the page defaults to 256x256 and says why", dflt[0] === "256" && dflt[1] === "256" &&
        dflt[2].includes("CPU"), JSON.stringify(dflt));
  // aspect presets: the ratio within one size multiple (8 for the tiny model), the area about 256x256
  await page.select("#aspect", "16:9");
  const ar = await page.evaluate(() => [Number(document.getElementById("width").value), Number(document.getElementById("height").value)]);
  check("browser: the 16:9 preset gives multiples of 8 near 16:9 and 256x256 pixels",
        ar[0] % 8 === 0 && ar[1] % 8 === 0 && Math.abs(ar[0] / ar[1] - 16 / 9) < 0.05 && Math.abs(ar[0] * ar[1] / 65536 - 1) < 0.05,
        `${ar[0]}x${ar[1]}`);

  const cfgHidden = await page.evaluate(() => [document.getElementById("cfgnormbox"), document.getElementById("cfgtruncbox")]
    .every((e) => e.hidden && e.offsetParent === null));
  check("browser: no CFG normalization / truncation inputs for a model without cfg_shaping (FLUX.2)", cfgHidden, "shown");

  // ---- a generation ----
  await page.evaluate(() => {   // what the progress bar shows, sampled every 5 ms
    window.__seen = [];
    setInterval(() => {
      const v = document.getElementById("progress").value;
      if (window.__seen[window.__seen.length - 1] !== v) window.__seen.push(v);
    }, 5);
  });
  const set = async (sel, v) => { await page.$eval(sel, (el) => { el.value = ""; }); if (v !== "") await page.type(sel, String(v)); };
  const figures = () => page.$$eval("#gallery figure", (f) => f.length);
  const waitFigures = async (n, ms) => {
    await page.waitForFunction((k) => document.querySelectorAll("#gallery figure").length >= k &&
                                      [...document.querySelectorAll("#gallery img")].every((i) => i.complete && i.naturalWidth > 0),
                               { timeout: ms }, n);
  };
  const newest = () => page.evaluate(() => {
    const f = document.querySelector("#gallery figure"), img = f.querySelector("img"), a = f.querySelector("a[download]");
    return { w: img.naturalWidth, h: img.naturalHeight, src: img.src, href: a && a.href, download: a && a.download,
             caption: f.querySelector("figcaption").textContent };
  });
  const W = 64, H = 48, STEPS = 8, SEED = 5;
  await page.type("#prompt", "a red fox in the snow");
  await set("#width", W);
  await set("#height", H);
  await set("#steps", STEPS);
  await set("#seed", SEED);
  await page.click("#go");
  await waitFigures(1, 120000);
  const got = await newest();
  const seen = await page.evaluate(() => window.__seen);
  const mid = seen.filter((v) => v > 0 && v < 1);
  const increasing = seen.every((v, i) => i === 0 || v >= seen[i - 1]);
  check("browser: the progress bar moves through the steps", mid.length >= 2 && increasing && seen.at(-1) === 1,
        `values seen: ${JSON.stringify(seen)}`);
  check("browser: the image appears at the size asked for", got.w === W && got.h === H, `${got.w}x${got.h}`);
  check("browser: the gallery has the parameters and a download link",
        got.caption.includes("a red fox in the snow") && got.caption.includes(`seed ${SEED}`) &&
        got.download === `ditrun-${SEED}.png` && got.href && got.href.startsWith("data:image/png;base64,"),
        `caption '${got.caption}', download '${got.download}'`);
  const api = await fetch(url + "/v1/images/generations", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt: "a red fox in the snow", size: `${W}x${H}`, steps: STEPS, seed: SEED }),
  }).then((r) => r.json());
  check("browser: the page's image equals the API's for the same settings",
        got.src === "data:image/png;base64," + api.data[0].b64_json, "the images differ");

  // ---- negative prompt and guidance reach the server ----
  await set("#negative", "blurry");
  await set("#guidance", 2);
  await set("#steps", 2);
  await set("#seed", 11);
  await page.click("#go");
  await waitFigures(2, 60000);
  const neg = await newest();
  const apiNeg = await fetch(url + "/v1/images/generations", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt: "a red fox in the snow", negative_prompt: "blurry", guidance: 2, size: `${W}x${H}`, steps: 2, seed: 11 }),
  }).then((r) => r.json());
  const apiPlain = await fetch(url + "/v1/images/generations", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt: "a red fox in the snow", size: `${W}x${H}`, steps: 2, seed: 11 }),
  }).then((r) => r.json());
  check("browser: negative prompt and guidance are sent (equal to the API's with them, not without)",
        neg.src === "data:image/png;base64," + apiNeg.data[0].b64_json && neg.src !== "data:image/png;base64," + apiPlain.data[0].b64_json &&
        neg.caption.includes("guidance 2"), neg.caption);
  await set("#negative", "");
  await set("#guidance", "");

  // ---- an edit with an uploaded reference image ----
  await page.click("#editbox summary");
  await (await page.$("#refs")).uploadFile(join(editDir, "edit2.png"));
  await page.waitForSelector("#refthumbs img");
  await set("#prompt", "make it blue");
  await set("#width", 64);
  await set("#height", 64);
  await set("#seed", 7);
  await page.click("#go");
  await waitFigures(3, 60000);
  const ed = await newest();
  const apiEd = await apiEdit(url, { prompt: "make it blue", n: 1, steps: 2, seed: 7, size: "64x64" },
                              [["image[]", "edit2.png", readFileSync(join(editDir, "edit2.png"))]]);
  check("browser: an edit with an uploaded image gives the API's image for the same form",
        ed.w === 64 && ed.h === 64 && ed.caption.includes("edit") && ed.src === "data:image/png;base64," + apiEd,
        `${ed.w}x${ed.h} '${ed.caption}' ${apiEd.length < 200 ? apiEd : ""}`);
  await page.click("#clearrefs");

  // ---- an inpaint through a mask drawn with the mouse ----
  await (await page.$("#init")).uploadFile(join(editDir, "inpaint.png"));   // 72x64
  await page.waitForSelector("#maskwrap.on");
  const box = await (await page.$("#mask")).boundingBox();
  await page.mouse.move(box.x + box.width * 0.3, box.y + box.height * 0.5);
  await page.mouse.down();
  for (let k = 1; k <= 10; k++) await page.mouse.move(box.x + box.width * (0.3 + 0.04 * k), box.y + box.height * 0.5);
  await page.mouse.up();
  const mask = await page.evaluate(async () => {
    const blob = await exportMask();
    const bmp = await createImageBitmap(blob);
    const c = document.createElement("canvas");
    c.width = bmp.width;
    c.height = bmp.height;
    const g = c.getContext("2d");
    g.drawImage(bmp, 0, 0);
    const at = (x, y) => Array.from(g.getImageData(x, y, 1, 1).data);
    const bytes = new Uint8Array(await blob.arrayBuffer());
    let bin = "";
    for (const b of bytes) bin += String.fromCharCode(b);
    return { w: bmp.width, h: bmp.height, stroke: at(36, 32), corner: at(2, 2), below: at(36, 60), png: btoa(bin) };
  });
  check("browser: the drawn mask is a PNG of the init image's size, white under the stroke, black elsewhere",
        mask.w === 72 && mask.h === 64 && mask.stroke.join() === "255,255,255,255" && mask.corner.join() === "0,0,0,255" &&
        mask.below.join() === "0,0,0,255", JSON.stringify({ ...mask, png: undefined }));
  await set("#prompt", "a hole in the wall");
  await set("#seed", 9);
  await page.click("#go");
  await waitFigures(4, 60000);
  const inp = await newest();
  const apiInp = await apiEdit(url, { prompt: "a hole in the wall", n: 1, steps: 2, seed: 9, strength: 0.8 },
                               [["image[]", "inpaint.png", readFileSync(join(editDir, "inpaint.png"))],
                                ["mask", "mask.png", Buffer.from(mask.png, "base64")]]);
  check("browser: the inpaint keeps the init image's size and equals the API's for the same image and mask",
        inp.w === 72 && inp.h === 64 && inp.caption.includes("inpaint") && inp.src === "data:image/png;base64," + apiInp,
        `${inp.w}x${inp.h} '${inp.caption}' ${apiInp.length < 200 ? apiInp : ""}`);
  if (screenshot) await page.screenshot({ path: screenshot, fullPage: true });
  await page.click("#clearinit");

  // ---- queue position, and cancelling a queued request ----
  const c0 = await cancelledTotal(url);
  const blocker = new AbortController();   // a long job from another client occupies the worker
  const long = await fetch(url + "/v1/images/generations", {
    method: "POST", headers: { "Content-Type": "application/json" }, signal: blocker.signal,
    body: JSON.stringify({ prompt: "long", size: "320x320", steps: 60, stream: true }),
  });
  const longReader = long.body.getReader();
  for (let text = ""; !text.includes("event: progress");) text += new TextDecoder().decode((await longReader.read()).value);
  await set("#prompt", "a queued fox");
  await set("#seed", 3);
  await page.click("#go");
  const queued = await page.waitForFunction(() => document.getElementById("status").textContent.includes("position 1"),
                                            { timeout: 10000 }).then(() => true, () => false);
  const hq = await health(url);
  check("browser: a waiting request shows its queue position", queued && hq.queue_depth === 1 && hq.running === 1,
        `status '${await page.$eval("#status", (e) => e.textContent)}', health ${JSON.stringify(hq)}`);
  await page.click("#cancel");
  const tq = await until(url, (h) => h.queue_depth === 0, 5);   // the client's socket is checked every 50 ms
  const st = await page.$eval("#status", (e) => e.textContent);
  check("browser: Cancel takes the queued request out of the queue (within 5 s)", tq >= 0 && st === "Cancelled.",
        `queue drained after ${tq} s, status '${st}'`);
  blocker.abort();
  // the tiny model's 320x320 step takes about 1 s on one thread; the job stops at the next step
  const tl = await until(url, (h) => h.running === 0 && h.queue_depth === 0, 20);
  check("browser: the other client's abandoned job stops (idle within 20 s)", tl >= 0, `still busy after 20 s`);

  // ---- cancelling the page's running job ----
  await set("#width", 320);
  await set("#height", 320);
  await set("#steps", 60);
  await page.click("#go");
  await page.waitForFunction(() => document.getElementById("progress").value > 0, { timeout: 30000 });
  await page.click("#cancel");
  const tr = await until(url, (h) => h.running === 0 && h.queue_depth === 0, 20);
  const c1 = await cancelledTotal(url);
  check("browser: Cancel stops the running job: the server is idle within 20 s, 3 jobs counted cancelled",
        tr >= 0 && c1 - c0 === 3, `idle after ${tr} s, cancelled ${c0} -> ${c1}`);
  await set("#width", 64);
  await set("#height", 64);
  await set("#steps", 2);
  const t0 = Date.now();
  await page.click("#go");
  await waitFigures(5, 30000);
  const tNext = (Date.now() - t0) / 1000;
  check("browser: the next request is served at once (64x64 in under 5 s)", tNext < 5, `${tNext} s`);
  check("browser: no cancelled image went into the history", (await figures()) === 5, `${await figures()} figures`);

  // ---- the history after a reload ----
  const before = await page.$$eval("#gallery figcaption", (c) => c.map((x) => x.textContent.replace(/ · .*$/, "")));
  await page.reload({ waitUntil: "load" });
  await page.waitForFunction(() => document.querySelectorAll("#gallery figure").length > 0, { timeout: 5000 }).catch(() => {});
  const after = await page.$$eval("#gallery figcaption", (c) => c.map((x) => x.textContent.replace(/ · .*$/, "")));
  const imgsOk = await page.$$eval("#gallery img", (i) => i.every((x) => x.complete && x.naturalWidth > 0));
  check("browser: the history is there after a reload, newest first, with its images",
        after.length === 5 && JSON.stringify(after) === JSON.stringify(before) && imgsOk,
        `before ${JSON.stringify(before)} after ${JSON.stringify(after)}`);
  await page.waitForFunction(() => document.getElementById("model").textContent.includes("model"), { timeout: 10000 });
  const figs = await page.$$("#gallery figure");
  await (await figs[2].$("button[data-act=settings]")).click();   // the edit
  const reused = await page.evaluate(() => ["prompt", "width", "height", "steps"].map((id) => document.getElementById(id).value));
  await (await figs[3].$("button[data-act=seed]")).click();       // the generation with guidance (seed 11)
  const reusedSeed = await page.$eval("#seed", (e) => e.value);
  check("browser: 'reuse settings' and 'reuse seed' fill the form from a history entry",
        JSON.stringify(reused) === JSON.stringify(["make it blue", "64", "64", "2"]) && reusedSeed === "11",
        `${JSON.stringify(reused)}, seed '${reusedSeed}'`);
  // the history stays within the storage quota: entries too big for it are dropped, the oldest first
  const bound = await page.evaluate(() => {
    const big = "x".repeat(2 << 20);
    const list = [1, 2, 3, 4].map((k) => ({ prompt: "big " + k, width: 8, height: 8, seed: k, image: big }));
    const kept = storeHistory(list);
    const stored = JSON.parse(localStorage.getItem("ditrun.history.v1"));
    return { kept: kept.map((e) => e.seed), stored: stored.map((e) => e.seed) };
  });
  // an image too big to keep whole (a noise PNG of 400x300) is kept as a JPEG thumbnail of at most 256 pixels a side
  const th = await page.evaluate(async () => {
    const c = document.createElement("canvas");
    c.width = 400;
    c.height = 300;
    const g = c.getContext("2d"), d = g.createImageData(400, 300);
    for (let i = 0; i < d.data.length; i++) d.data[i] = (i * 2654435761) >>> 24;
    g.putImageData(d, 0, 0);
    const b64 = c.toDataURL("image/png").split(",")[1];
    const t = await thumbnail(b64);
    const img = new Image();
    img.src = t.src;
    await img.decode();
    return { pngChars: b64.length, full: t.full, jpeg: t.src.startsWith("data:image/jpeg"), w: img.naturalWidth,
             h: img.naturalHeight, chars: t.src.length };
  });
  check("browser: a large image goes into the history as a 256x192 JPEG thumbnail, a fraction of its size",
        th.pngChars > 96 * 1024 && !th.full && th.jpeg && th.w === 256 && th.h === 192 && th.chars < th.pngChars / 4,
        JSON.stringify(th));
  check("browser: over the storage quota the oldest history entries are dropped (not an error)",
        bound.kept.length >= 1 && bound.kept.length < 4 && bound.kept[0] === 1 &&
        JSON.stringify(bound.kept) === JSON.stringify(bound.stored), JSON.stringify(bound));
  check("browser: no script errors", errors.length === 0, errors.join("; "));
} catch (e) {
  check("browser: page test ran", false, e && e.stack ? e.stack.split("\n").slice(0, 3).join(" | ") : String(e));
} finally {
  if (browser) await browser.close();
  const code = await stopServer(srv);
  check("browser: server stops with 0", code === 0, `exit ${code}`);
}

// ---- a Z-Image server (cfg_shaping): the CFG normalization / truncation inputs are shown and sent ----
const zi = await startServer([], join(dirname(model), "zimage", "model"));
try {
  await waitHealthy(zi.url);
  browser = await puppeteer.launch(launchArgs(join(profile, "zi")));
  const page = await browser.newPage();
  await page.goto(zi.url + "/", { waitUntil: "load" });
  await page.waitForFunction(() => !document.getElementById("cfgnormbox").hidden, { timeout: 10000 }).catch(() => {});
  const shown = await page.evaluate(() => [document.getElementById("cfgnormbox"), document.getElementById("cfgtruncbox")]
    .every((e) => !e.hidden && e.offsetParent !== null));
  check("browser: Z-Image's page shows CFG normalization and truncation (cfg_shaping)", shown, "hidden");
  const set = async (sel, v) => { await page.$eval(sel, (el) => { el.value = ""; }); if (v !== "") await page.type(sel, String(v)); };
  await page.select("#aspect", "");
  await page.type("#prompt", "a red fox in the snow");
  await set("#width", 64);
  await set("#height", 48);
  await set("#steps", 3);
  await set("#seed", 5);
  await set("#guidance", 3);
  await set("#cfgnorm", 1);
  await set("#cfgtrunc", 0.3);
  await page.click("#go");
  await page.waitForFunction(() => { const i = document.querySelector("#gallery img"); return i && i.complete && i.naturalWidth > 0; },
                             { timeout: 120000 });
  const src = await page.$eval("#gallery img", (i) => i.src);
  const gen = async (extra) => fetch(zi.url + "/v1/images/generations", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt: "a red fox in the snow", size: "64x48", steps: 3, seed: 5, guidance: 3, ...extra }),
  }).then((r) => r.json()).then((j) => "data:image/png;base64," + j.data[0].b64_json);
  const withCfg = await gen({ cfg_normalization: 1, cfg_truncation: 0.3 }), without = await gen({});
  check("browser: cfg_normalization and cfg_truncation are sent (equal to the API's with them, not without)",
        src === withCfg && src !== without, "the images differ");
  // the history keeps them: its caption names them, and "reuse settings" puts them back after the inputs change
  const cap = await page.$eval("#gallery figcaption", (c) => c.textContent);
  await set("#cfgnorm", "");
  await set("#cfgtrunc", 0.9);
  await (await page.$("#gallery button[data-act=settings]")).click();
  const back = await page.evaluate(() => [document.getElementById("cfgnorm").value, document.getElementById("cfgtrunc").value]);
  check("browser: the history names the CFG options and 'reuse settings' restores them",
        cap.includes("CFG normalization 1") && cap.includes("CFG truncation 0.3") && back[0] === "1" && back[1] === "0.3",
        `caption '${cap}', inputs ${JSON.stringify(back)}`);
} catch (e) {
  check("browser: Z-Image test ran", false, e && e.stack ? e.stack.split("\n").slice(0, 3).join(" | ") : String(e));
} finally {
  if (browser) await browser.close();
  const code = await stopServer(zi.srv);
  check("browser: the Z-Image server stops with 0", code === 0, `exit ${code}`);
}

// ---- a server with an API key: the model label after the key is entered ----
const keyFile = join(profile, "key");
writeFileSync(keyFile, "sekrit-key\n");
const keyed = await startServer(["--api-key-file", keyFile]);
try {
  await waitHealthy(keyed.url);
  browser = await puppeteer.launch(launchArgs(join(profile, "b2")));
  const page = await browser.newPage();
  await page.goto(keyed.url + "/", { waitUntil: "load" });
  await page.waitForFunction(() => document.getElementById("model").textContent.includes("API key"), { timeout: 10000 });
  await page.type("#key", "sekrit-key");
  await page.keyboard.press("Tab");   // the change event
  const label = await page.waitForFunction(() => document.getElementById("model").textContent.includes("model ("),
                                           { timeout: 10000 }).then(() => page.$eval("#model", (e) => e.textContent), () => "");
  check("browser: the model label is refreshed after the API key is entered", label.startsWith("model ("), `label '${label}'`);
} catch (e) {
  check("browser: API key test ran", false, e && e.stack ? e.stack.split("\n").slice(0, 3).join(" | ") : String(e));
} finally {
  if (browser) await browser.close();
  const code = await stopServer(keyed.srv);
  check("browser: the keyed server stops with 0", code === 0, `exit ${code}`);
  rmSync(profile, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
