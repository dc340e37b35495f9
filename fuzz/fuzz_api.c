/* fuzz_api.c — libFuzzer target: arbitrary bytes as the JSON body of the server's POST /v1/images/generations
 * (serve/api.c: parsing, every limit, the engine's request checks, the answer and error JSON: fuzz_api_drive.h).
 * Seeds: fuzz/corpus/api (valid requests of every shape and one of each refusal). */
#include <stddef.h>
#include <stdint.h>

#include "fuzz_api_drive.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (fuzz_api_one(data, size) < 0) __builtin_trap();
    return 0;
}
