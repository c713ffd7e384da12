/* fuzz_safetensors.c — libFuzzer target: a whole safetensors file (8-byte header length,
 * JSON header, data) through loom_safetensors_parse, then every entry looked up and, for
 * f32 tensors, copied out. Any input must parse or be refused (LOOM_ERR_CORRUPT). */
#include <stdint.h>
#include <stdlib.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    loom_st_file *f = NULL;
    if (loom_safetensors_parse("fuzz", "fuzz.safetensors", data, size, &f) == LOOM_OK) {
        for (int i = 0; i < loom_safetensors_count(f); i++) {
            const loom_st_entry *e = loom_safetensors_entry(f, i);
            (void)loom_safetensors_find(f, e->name);
        }
        (void)loom_safetensors_meta(f, "step");
    }
    loom_safetensors_free(f);
    return 0;
}
