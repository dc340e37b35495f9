/* test_browser.c — the web page of `ditrun serve` in headless Chromium: runs tests/browser/page.test.mjs (node +
 * puppeteer-core against Debian's /usr/bin/chromium and a real server of $BUILD/ditrun), whose PASS/FAIL lines count
 * here. Skips with the reason when chromium, node or tests/browser/node_modules (npm ci) is missing; .ci/install-deps
 * installs all three. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

int main(void) {
    const char *build = getenv("BUILD");
    char exe[512], model[512], cmd[2048];
    snprintf(exe, sizeof exe, "%s/ditrun", build && *build ? build : "build");
    snprintf(model, sizeof model, "%s/model", t_fixtures());
    const char *chromium = !access("/usr/bin/chromium", X_OK) ? "/usr/bin/chromium" : NULL;
    if (access(exe, X_OK)) { T_SKIP("browser", "%s not built", exe); return T_DONE(); }
    if (!chromium) { T_SKIP("browser", "no /usr/bin/chromium (apt-get install chromium; .ci/install-deps does)"); return T_DONE(); }
    if (system("node --version >/dev/null 2>&1")) { T_SKIP("browser", "node is not installed (apt-get install nodejs npm)"); return T_DONE(); }
    if (access("tests/browser/node_modules/puppeteer-core/package.json", R_OK)) {
        T_SKIP("browser", "puppeteer-core is not installed (npm ci --prefix tests/browser; .ci/install-deps does)");
        return T_DONE();
    }
    snprintf(cmd, sizeof cmd, "node tests/browser/page.test.mjs %s %s %s", exe, model, chromium);
    fflush(stdout);
    int st = system(cmd);   /* its PASS/FAIL lines go to our stdout */
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
