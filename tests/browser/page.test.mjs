// page.test.mjs — the page of `ditrun serve` in a real browser: headless Chromium (Debian's /usr/bin/chromium,
// driven by puppeteer-core; no browser download) against a real server on an ephemeral port with the bundled tiny
// model. Types a prompt, presses Generate, watches the progress bar move through the steps, and checks that the
// image appears, is the size asked for, equals the API's image for the same settings, and has a download link.
// Prints PASS/FAIL lines (tests/test_browser.c runs it).  usage: node page.test.mjs DITRUN MODEL CHROMIUM
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import puppeteer from "puppeteer-core";

const [ditrun, model, chromium] = process.argv.slice(2);
let failed = 0;
const check = (name, ok, why) => {
  if (ok) console.log(`PASS ${name}`);
  else { console.log(`FAIL ${name}: ${why}`); failed++; }
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function startServer() {
  const srv = spawn(ditrun, ["serve", "--model", model, "--port", "0", "--backend", "cpu", "--threads", "1",
                             "--max-sequence-length", "8", "-q"], { stdio: ["ignore", "pipe", "inherit"] });
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

async function waitHealthy(url) {
  for (let i = 0; i < 300; i++) {
    try { if ((await fetch(url + "/health")).status === 200) return true; } catch (_) {}
    await sleep(100);
  }
  return false;
}

const { srv, url } = await startServer();
const profile = mkdtempSync(join(tmpdir(), "ditrun-chromium-"));
let browser;
try {
  check("browser: server healthy", await waitHealthy(url), "/health never answered 200");
  browser = await puppeteer.launch({
    executablePath: chromium,
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           `--user-data-dir=${profile}`],
  });
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(url + "/", { waitUntil: "load" });
  // the page asks /v1/models for the model's name and defaults
  await page.waitForFunction(() => document.getElementById("model").textContent.includes("model"), { timeout: 10000 });
  check("browser: the page shows the model", true, "");
  // what the progress bar shows, sampled every 5 ms
  await page.evaluate(() => {
    window.__seen = [];
    setInterval(() => {
      const v = document.getElementById("progress").value;
      if (window.__seen[window.__seen.length - 1] !== v) window.__seen.push(v);
    }, 5);
  });
  const W = 64, H = 48, STEPS = 8, SEED = 5;
  const set = async (sel, v) => { await page.$eval(sel, (el) => { el.value = ""; }); await page.type(sel, String(v)); };
  await page.type("#prompt", "a red fox in the snow");
  await set("#width", W);
  await set("#height", H);
  await set("#steps", STEPS);
  await set("#seed", SEED);
  await page.click("#go");
  await page.waitForSelector("#gallery img", { timeout: 120000 });
  await page.waitForFunction(() => { const i = document.querySelector("#gallery img"); return i && i.complete && i.naturalWidth > 0; },
                             { timeout: 10000 });
  const got = await page.evaluate(() => {
    const img = document.querySelector("#gallery img");
    const a = document.querySelector("#gallery a[download]");
    return { w: img.naturalWidth, h: img.naturalHeight, src: img.src, href: a && a.href, download: a && a.download,
             caption: document.querySelector("#gallery figcaption").textContent,
             status: document.getElementById("status").textContent, seen: window.__seen };
  });
  const mid = got.seen.filter((v) => v > 0 && v < 1);
  const increasing = got.seen.every((v, i) => i === 0 || v >= got.seen[i - 1]);
  check("browser: the progress bar moves through the steps", mid.length >= 2 && increasing && got.seen.at(-1) === 1,
        `values seen: ${JSON.stringify(got.seen)}`);
  check("browser: the image appears at the size asked for", got.w === W && got.h === H, `${got.w}x${got.h}`);
  check("browser: the gallery has the parameters and a download link",
        got.caption.includes("a red fox in the snow") && got.caption.includes(`seed ${SEED}`) &&
        got.download === `ditrun-${SEED}.png` && got.href && got.href.startsWith("data:image/png;base64,"),
        `caption '${got.caption}', download '${got.download}'`);
  // the same settings through the API give the same PNG
  const api = await fetch(url + "/v1/images/generations", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ prompt: "a red fox in the snow", size: `${W}x${H}`, steps: STEPS, seed: SEED }),
  }).then((r) => r.json());
  check("browser: the page's image equals the API's for the same settings",
        got.src === "data:image/png;base64," + api.data[0].b64_json, "the images differ");
  check("browser: no script errors", errors.length === 0, errors.join("; "));
  await page.screenshot({ path: join(profile, "page.png") });
} catch (e) {
  check("browser: page test ran", false, e && e.stack ? e.stack.split("\n").slice(0, 3).join(" | ") : String(e));
} finally {
  if (browser) await browser.close();
  srv.kill("SIGTERM");
  const code = await new Promise((r) => { if (srv.exitCode !== null) r(srv.exitCode); else srv.on("exit", (c) => r(c)); });
  check("browser: server stops with 0", code === 0, `exit ${code}`);
  rmSync(profile, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
