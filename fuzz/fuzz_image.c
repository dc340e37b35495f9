/* fuzz_image.c — libFuzzer target: arbitrary bytes as an uploaded image (PNG / JPEG / WebP decoders from
 * memory, size limits, conversions, resizing and the editing preprocessing: fuzz_image_drive.h). Every
 * refusal must name the input. Seeds: the sample images of tests/images (every mode, broken ones too). */
#include <stddef.h>
#include <stdint.h>

#include "fuzz_image_drive.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (fuzz_image_one(data, size) < 0) __builtin_trap();
    return 0;
}
