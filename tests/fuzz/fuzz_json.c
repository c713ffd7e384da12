/* fuzz_json.c — libFuzzer target: the JSON parser that reads checkpoint manifests and
 * safetensors headers (core/io/json.c), then a walk over the keys a manifest has. Any
 * input must give a document or LOOM_ERR_CORRUPT, never a crash (ASan + UBSan). */
#include <stddef.h>
#include <stdint.h>

#include "io/json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    loom_json_doc *doc = NULL;
    loom_json_error err;
    if (loom_json_parse((const char *)data, size, NULL, &doc, &err) == LOOM_OK) {
        const loom_json *root = loom_json_root(doc);
        static const char *const keys[] = {"format", "step", "tensors", "files", "layout",
                                           "optimizer", "data", "precision", "config"};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
            int64_t v;
            const loom_json *x = loom_json_get(root, keys[i]);
            if (x)
                (void)loom_json_int64(x, &v);
        }
    }
    loom_json_free(doc);
    return 0;
}
