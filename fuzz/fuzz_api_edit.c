/* fuzz_api_edit.c — libFuzzer target: arbitrary bytes as the form parts of the server's POST /v1/images/edits
 * (serve/api_edit.c: parts in pieces, text fields, uploads decoded from memory, image checks, limits, the engine's
 * request checks, the error JSON: fuzz_api_edit_drive.h). Seeds: fuzz/corpus/api_edit (requests with real images of
 * every shape and one of each refusal). */
#include <stddef.h>
#include <stdint.h>

#include "fuzz_api_edit_drive.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (fuzz_api_edit_one(data, size) < 0) __builtin_trap();
    return 0;
}
